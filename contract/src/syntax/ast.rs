//! The syntax tree of one `.rfidl` file, exactly as written, with spans.
//!
//! Nothing here is resolved or checked: names are strings as they appear,
//! types are unresolved. Every node carries the [`Span`] of its text so the
//! checker can point at it and the formatter can find the comments around it.

use crate::diagnostics::Span;

/// A name as written, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    /// The text exactly as written. For a package name or a qualified type
    /// this is the whole dotted name (`hr.employees`, `common.Money`).
    pub text: String,
    /// Where the name is, and nothing around it.
    pub span: Span,
}

/// `///` lines before a node, without the `///` and one leading space.
pub type Docs = Vec<String>;

/// One parsed `.rfidl` file: its `package` declaration and its items.
///
/// Plain `//` comments are not in the tree; the formatter finds them in the
/// text between the spans.
#[derive(Debug, Clone, PartialEq)]
pub struct File {
    /// The `package a.b;` declaration (exactly one per file, or the parser
    /// fails with E0005/E0006).
    pub package: PackageDecl,
    /// Imports, records, enums and services, in source order.
    pub items: Vec<Item>,
    /// Doc comments after the last item (attached to nothing; the checker warns).
    pub trailing_docs: Vec<(String, Span)>,
    /// The whole text of the file.
    pub span: Span,
}

/// `package hr.employees;`: the namespace of the file's types.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageDecl {
    /// The `///` lines above it: the package's documentation
    /// ([`PackageContract::docs`](crate::manifest::PackageContract::docs)).
    pub docs: Docs,
    /// Always refused by the checker (E0071); kept so it can say so.
    pub annotations: Vec<Annotation>,
    /// The dotted package name, as written (the checker requires lowercase
    /// segments, E0052).
    pub name: Ident,
    /// From its first doc comment or annotation to the `;`.
    pub span: Span,
}

/// A top-level item after the package declaration.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `import "path.rfidl";`
    Import(Import),
    /// `record Name { … }`
    Record(Record),
    /// `enum Name { … }`
    Enum(Enum),
    /// `service Name vN { … }`
    Service(Service),
}

impl Item {
    /// The span of the whole item, doc comments and annotations included.
    pub fn span(&self) -> Span {
        match self {
            Item::Import(i) => i.span,
            Item::Record(r) => r.span,
            Item::Enum(e) => e.span,
            Item::Service(s) => s.span,
        }
    }
}

/// `import "common/common.rfidl";`: makes the types of that file visible,
/// qualified by their package.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    /// `///` lines above it; documentation of nothing, kept for the formatter.
    pub docs: Docs,
    /// Always refused by the checker (E0071); kept so it can say so.
    pub annotations: Vec<Annotation>,
    /// The path as written, escapes resolved.
    pub path: String,
    /// The string literal, quotes included (where E0060 points).
    pub path_span: Span,
    /// From its first doc comment or annotation to the `;`.
    pub span: Span,
}

/// `record Name { field: Type, … }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The `///` lines above it.
    pub docs: Docs,
    /// Its annotations (only `@deprecated` is allowed on a record).
    pub annotations: Vec<Annotation>,
    /// The record's name (`UpperCamelCase`, E0050).
    pub name: Ident,
    /// The fields in source order; may be empty.
    pub fields: Vec<Field>,
    /// From its first doc comment or annotation to the closing `}`.
    pub span: Span,
}

/// A record field or a method parameter: `name: Type`.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The `///` lines above it.
    pub docs: Docs,
    /// Its annotations (only `@deprecated` is allowed here).
    pub annotations: Vec<Annotation>,
    /// The field or parameter name (`snake_case`, E0051).
    pub name: Ident,
    /// Its type as written; `T?` makes it optional.
    pub ty: TypeExpr,
    /// From its first doc comment or annotation to the end of the type.
    pub span: Span,
}

/// `enum Name { Variant, … }`: unit variants only.
#[derive(Debug, Clone, PartialEq)]
pub struct Enum {
    /// The `///` lines above it.
    pub docs: Docs,
    /// Its annotations (only `@deprecated` is allowed on an enum).
    pub annotations: Vec<Annotation>,
    /// The enum's name (`UpperCamelCase`, E0050).
    pub name: Ident,
    /// The variants in source order (the checker requires at least one, E0043).
    pub variants: Vec<Variant>,
    /// From its first doc comment or annotation to the closing `}`.
    pub span: Span,
}

/// One variant of an enum.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// The `///` lines above it.
    pub docs: Docs,
    /// Its annotations (only `@deprecated` is allowed here).
    pub annotations: Vec<Annotation>,
    /// The variant's name (`UpperCamelCase`), which is also its JSON form.
    pub name: Ident,
    /// From its first doc comment or annotation to the end of the name.
    pub span: Span,
}

/// `service Name vN { method* }`: one version of a service.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// The `///` lines above it.
    pub docs: Docs,
    /// Its annotations (only `@deprecated` is allowed on a service).
    pub annotations: Vec<Annotation>,
    /// The service's name, without the version (`UpperCamelCase`).
    pub name: Ident,
    /// The number after `v`; `None` when it does not fit a `u32`.
    pub version: Option<u32>,
    /// The `vN` token (where E0042 points).
    pub version_span: Span,
    /// The methods in source order; may be empty.
    pub methods: Vec<Method>,
    /// From its first doc comment or annotation to the closing `}`.
    pub span: Span,
}

/// The keyword a method starts with: who sends it, and whether it may
/// answer (see [`crate::manifest::MethodKind`], its resolved twin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodKind {
    /// `signal`: service -> engine, "something happened"; never a response.
    Signal,
    /// `pushcall`: service -> engine, a call the engine records and matches
    /// to waits; may declare a response.
    Pushcall,
    /// `command`: engine -> service, "do this"; may declare a response.
    Command,
}

impl MethodKind {
    /// The keyword as written: `signal`, `pushcall` or `command`.
    pub fn keyword(self) -> &'static str {
        match self {
            MethodKind::Signal => "signal",
            MethodKind::Pushcall => "pushcall",
            MethodKind::Command => "command",
        }
    }
}

/// One method of a service: `annotation* kind Name(param: Type, …) [-> Type];`.
#[derive(Debug, Clone, PartialEq)]
pub struct Method {
    /// The `///` lines above it.
    pub docs: Docs,
    /// Its annotations: `@correlate`, `@delivery`, `@deprecated`.
    pub annotations: Vec<Annotation>,
    /// `signal`, `pushcall` or `command`.
    pub kind: MethodKind,
    /// The kind keyword.
    pub kind_span: Span,
    /// The method's name (`UpperCamelCase`).
    pub name: Ident,
    /// The parameters in source order, each like a record field.
    pub params: Vec<Field>,
    /// The type after `->`, if any (E0041 on a signal).
    pub response: Option<TypeExpr>,
    /// From its first doc comment or annotation to the `;`.
    pub span: Span,
}

/// A type as written, unresolved: `string`, `Money`, `common.Money`,
/// `list<T>`, `map<K, V>`, each possibly followed by `?`.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeExpr {
    /// The type without its `?`.
    pub kind: TypeKind,
    /// Whether a `?` follows: the value may be missing.
    pub optional: bool,
    /// The whole type, `?` included.
    pub span: Span,
}

/// The shape of a [`TypeExpr`].
#[derive(Debug, Clone, PartialEq)]
pub enum TypeKind {
    /// A scalar keyword, a local name, or a qualified `pkg.Name`: resolved by the checker.
    Named(Ident),
    /// `list<T>`.
    List(Box<TypeExpr>),
    /// `map<K, V>`: the key type as written; the checker requires `string`
    /// (E0040).
    Map(Box<TypeExpr>, Box<TypeExpr>),
}

/// `@name` or `@name(arg, …)`. The parser accepts any name and arguments;
/// the checker knows the closed set (`@correlate`, `@delivery`,
/// `@deprecated`) and their arguments (E0070-E0074).
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    /// The name after `@`.
    pub name: Ident,
    /// `None` without parentheses; `Some(vec![])` for `@x()`.
    pub args: Option<Vec<AnnotationArg>>,
    /// From `@` to the closing `)`, or to the end of the name.
    pub span: Span,
}

/// One argument of an annotation: `value` or `name = value`.
#[derive(Debug, Clone, PartialEq)]
pub struct AnnotationArg {
    /// The name before `=` (`max_retries`), `None` for a positional argument.
    pub name: Option<Ident>,
    /// The value.
    pub value: Value,
    /// The whole argument, name included.
    pub span: Span,
}

/// An annotation argument's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string literal, escapes resolved: `"48h"`, `"use v2"`.
    String(String),
    /// Kept as text: range checks belong to the checker.
    Integer(String),
    /// A dotted name: `employee.id` in `@correlate(employee.id)`.
    Path(String),
}

impl Value {
    /// What kind of value it is, for messages: `a string`, `an integer`,
    /// `a name`.
    pub fn describe(&self) -> &'static str {
        match self {
            Value::String(_) => "a string",
            Value::Integer(_) => "an integer",
            Value::Path(_) => "a name",
        }
    }
}
