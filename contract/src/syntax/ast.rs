//! The syntax tree of one `.rfidl` file, exactly as written, with spans.
//!
//! Nothing here is resolved or checked: names are strings as they appear,
//! types are unresolved. Every node carries the [`Span`] of its text so the
//! checker can point at it and the formatter can find the comments around it.

use crate::diagnostics::Span;

/// A name as written, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    pub text: String,
    pub span: Span,
}

/// `///` lines before a node, without the `///` and one leading space.
pub type Docs = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
pub struct File {
    pub package: PackageDecl,
    pub items: Vec<Item>,
    /// Doc comments after the last item (attached to nothing; the checker warns).
    pub trailing_docs: Vec<(String, Span)>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PackageDecl {
    pub docs: Docs,
    /// Always refused by the checker (E0071); kept so it can say so.
    pub annotations: Vec<Annotation>,
    pub name: Ident,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Import(Import),
    Record(Record),
    Enum(Enum),
    Service(Service),
}

impl Item {
    pub fn span(&self) -> Span {
        match self {
            Item::Import(i) => i.span,
            Item::Record(r) => r.span,
            Item::Enum(e) => e.span,
            Item::Service(s) => s.span,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    pub docs: Docs,
    /// Always refused by the checker (E0071); kept so it can say so.
    pub annotations: Vec<Annotation>,
    /// The path as written, escapes resolved.
    pub path: String,
    pub path_span: Span,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub docs: Docs,
    pub annotations: Vec<Annotation>,
    pub name: Ident,
    pub fields: Vec<Field>,
    pub span: Span,
}

/// A record field or a method parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub docs: Docs,
    pub annotations: Vec<Annotation>,
    pub name: Ident,
    pub ty: TypeExpr,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Enum {
    pub docs: Docs,
    pub annotations: Vec<Annotation>,
    pub name: Ident,
    pub variants: Vec<Variant>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    pub docs: Docs,
    pub annotations: Vec<Annotation>,
    pub name: Ident,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    pub docs: Docs,
    pub annotations: Vec<Annotation>,
    pub name: Ident,
    /// The number after `v`; `None` when it does not fit a `u32`.
    pub version: Option<u32>,
    pub version_span: Span,
    pub methods: Vec<Method>,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodKind {
    Signal,
    Pushcall,
    Command,
}

impl MethodKind {
    pub fn keyword(self) -> &'static str {
        match self {
            MethodKind::Signal => "signal",
            MethodKind::Pushcall => "pushcall",
            MethodKind::Command => "command",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Method {
    pub docs: Docs,
    pub annotations: Vec<Annotation>,
    pub kind: MethodKind,
    pub kind_span: Span,
    pub name: Ident,
    pub params: Vec<Field>,
    pub response: Option<TypeExpr>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TypeExpr {
    pub kind: TypeKind,
    pub optional: bool,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TypeKind {
    /// A scalar keyword, a local name, or a qualified `pkg.Name`: resolved by the checker.
    Named(Ident),
    List(Box<TypeExpr>),
    Map(Box<TypeExpr>, Box<TypeExpr>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    pub name: Ident,
    /// `None` without parentheses; `Some(vec![])` for `@x()`.
    pub args: Option<Vec<AnnotationArg>>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AnnotationArg {
    pub name: Option<Ident>,
    pub value: Value,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    String(String),
    /// Kept as text: range checks belong to the checker.
    Integer(String),
    Path(String),
}

impl Value {
    pub fn describe(&self) -> &'static str {
        match self {
            Value::String(_) => "a string",
            Value::Integer(_) => "an integer",
            Value::Path(_) => "a name",
        }
    }
}
