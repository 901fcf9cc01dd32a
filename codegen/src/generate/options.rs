//! What a generation run is asked for: which sides, extra derives and
//! attributes, and the files it produces. Shared by [`crate::Builder`] and the
//! `rfidl generate` CLI; it lives beside the generator (which reads it) so
//! that the build-script front door depends on the generator and never the
//! other way round.

/// Which side(s) of each service version to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Sides {
    /// Both: clients, handler traits and receivers for every direction.
    #[default]
    Both,
    /// What a service implementation needs: a client to send its signals and
    /// pushcalls to the engine, and the handler trait + receiver for commands.
    Service,
    /// What the engine needs: a client to send commands, and the handler
    /// trait + receiver for signals and pushcalls.
    Engine,
}

impl Sides {
    pub(crate) fn service(self) -> bool {
        matches!(self, Sides::Both | Sides::Service)
    }
    pub(crate) fn engine(self) -> bool {
        matches!(self, Sides::Both | Sides::Engine)
    }
}

/// Extra derives or attributes for generated types, matched by the type's
/// fully qualified contract name (`hr.employees.Employee`), a package prefix
/// (`hr.employees`), or `.` for every type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TypeRule {
    pub(crate) path: String,
    pub(crate) kind: TypeRuleKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TypeRuleKind {
    Derive(String),
    Attribute(String),
}

impl TypeRule {
    pub(crate) fn matches(&self, qualified_name: &str) -> bool {
        self.path == "."
            || self.path == qualified_name
            || qualified_name
                .strip_prefix(self.path.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
    }
}

/// Generation options shared by [`Builder`](crate::Builder) and the `rfidl generate` CLI.
///
/// Set through [`Builder`](crate::Builder)'s methods
/// ([`sides`](crate::Builder::sides),
/// [`type_derive`](crate::Builder::type_derive),
/// [`type_attribute`](crate::Builder::type_attribute)); `Options::default()`
/// generates both sides with no extra derives or attributes.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Which side(s) of each service version to generate.
    pub sides: Sides,
    pub(crate) type_rules: Vec<TypeRule>,
}

/// One generated file: a name relative to the output directory, and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    /// The path relative to the output directory, `/`-separated:
    /// `hr.employees.rs`, the module tree (`rfidl_contracts.rs` or
    /// `mod.rs`), `manifests/hr.employees.EmpService.v1.json`.
    pub name: String,
    /// The whole text of the file: Rust laid out as prettyplease prints it,
    /// under the `@generated` header, or a manifest as JSON or YAML.
    pub contents: String,
}
