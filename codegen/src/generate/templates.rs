//! Template contexts: what each askama template in `templates/` sees.
//!
//! These structs hold names and types already in their Rust spelling; the
//! decisions (naming, type mapping, which side gets what) are made in
//! [`super::plan`], so templates only lay text out. Nothing here builds Rust
//! source by concatenation.

use askama::Template;

/// `templates/package.rs.askama`: one contract package as one Rust module.
#[derive(Debug, Template)]
#[template(path = "package.rs.askama", escape = "none")]
pub struct PackageTemplate {
    pub records: Vec<RecordView>,
    pub enums: Vec<EnumView>,
    pub services: Vec<ServiceView>,
}

/// `templates/record.rs.askama` alone: one record of a package, rendered
/// and formatted on its own (see [`super::render_package`]).
#[derive(Debug, Template)]
#[template(path = "record.rs.askama", escape = "none")]
pub struct RecordTemplate<'a> {
    pub record: &'a RecordView,
}

/// `templates/enum.rs.askama` alone: one enum of a package.
#[derive(Debug, Template)]
#[template(path = "enum.rs.askama", escape = "none")]
pub struct EnumTemplate<'a> {
    pub enumeration: &'a EnumView,
}

/// `templates/service.rs.askama` alone: one service version's module.
#[derive(Debug, Template)]
#[template(path = "service.rs.askama", escape = "none")]
pub struct ServiceTemplate<'a> {
    pub service: &'a ServiceView,
}

#[derive(Debug, Clone)]
pub struct RecordView {
    pub name: String,
    pub docs: Vec<String>,
    pub deprecated: Option<String>,
    /// A field is deprecated or names a deprecated type: the struct and its
    /// derives need `#[allow(deprecated)]`.
    pub uses_deprecated: bool,
    pub extra_derives: Vec<String>,
    pub extra_attributes: Vec<String>,
    pub fields: Vec<FieldView>,
}

/// A record field or a method parameter.
#[derive(Debug, Clone)]
pub struct FieldView {
    /// Rust identifier (raw identifier for keywords, e.g. `r#type`).
    pub rust_name: String,
    /// The JSON member name: the name as written in the contract.
    pub json_name: String,
    pub docs: Vec<String>,
    pub deprecated: Option<String>,
    pub rust_type: String,
    pub optional: bool,
    /// The path serde calls to leave out a `None`: `Option::is_none`, fully
    /// qualified when a contract type shadows `Option`.
    pub is_none: &'static str,
}

impl FieldView {
    /// `pub name: Type,` as a struct field at `indent`: the type, broken
    /// over lines as prettyplease breaks it when the line is too long.
    pub fn field_type(&self, indent: usize) -> std::borrow::Cow<'_, str> {
        let column = indent + "pub ".len() + self.rust_name.len() + ": ".len();
        super::layout::type_at(&self.rust_type, indent, column, ",".len())
    }

    /// `name: Type,` as a function parameter at `indent`, broken like
    /// [`FieldView::field_type`].
    pub fn param_type(&self, indent: usize) -> std::borrow::Cow<'_, str> {
        let column = indent + self.rust_name.len() + ": ".len();
        super::layout::type_at(&self.rust_type, indent, column, ",".len())
    }
}

#[derive(Debug, Clone)]
pub struct EnumView {
    pub name: String,
    pub docs: Vec<String>,
    pub deprecated: Option<String>,
    pub extra_derives: Vec<String>,
    pub extra_attributes: Vec<String>,
    pub variants: Vec<VariantView>,
}

#[derive(Debug, Clone)]
pub struct VariantView {
    pub name: String,
    pub docs: Vec<String>,
    pub deprecated: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ServiceView {
    /// `emp_service_v1`.
    pub module: String,
    pub interface: String,
    pub version: u32,
    pub fingerprint: String,
    pub manifest_json: String,
    pub docs: Vec<String>,
    pub deprecated: Option<String>,
    pub methods: Vec<MethodView>,
    /// `endpoints: &[…]` of `HOSTED` fits on one line (see [`super::layout`]).
    pub endpoints_inline: bool,
    /// One group per direction that has methods and is generated.
    pub groups: Vec<GroupView>,
}

/// The methods that flow in one direction, with the client that sends them
/// and the handler trait + receiver glue that receive them.
#[derive(Debug, Clone)]
pub struct GroupView {
    /// Who receives these methods: "engine" or "service".
    pub peer: &'static str,
    pub client: &'static str,
    pub handler: &'static str,
    pub receiver: &'static str,
    pub hosted_const: &'static str,
    /// "signals and pushcalls" / "commands", for docs.
    pub kinds_doc: &'static str,
    pub client_enabled: bool,
    pub handler_enabled: bool,
    pub methods: Vec<MethodView>,
    /// `endpoints: &[…]` of the receiver's hosted list fits on one line.
    pub endpoints_inline: bool,
    /// The answer-handler trait and its router (`EngineAnswers`, …).
    pub answers: &'static str,
    pub answer_router: &'static str,
    /// The methods that declare a response: the client's side gets an
    /// answer-handler method for each.
    pub answered: Vec<MethodView>,
    /// The failure-handler trait and its router (`EngineFailures`, …): one
    /// method per method of the group.
    pub failures: &'static str,
    pub failure_router: &'static str,
    /// The receivers' `handle` (one match arm per method) may pass clippy's
    /// `too_many_lines`: it gets an `allow`.
    pub receiver_too_many_lines: bool,
    /// The same for the answer routers' `handle`.
    pub answer_router_too_many_lines: bool,
    /// The same for the failure routers' `handle`.
    pub failure_router_too_many_lines: bool,
    /// `endpoints: &[…]` of the `aio` receiver's hosted list fits on one line.
    pub aio_endpoints_inline: bool,
    /// The `aio` answer router's `> …AsyncResponseHandler<S> for Router<H> {`
    /// fits on one line (else `for …` goes on the next).
    pub aio_answer_router_for_inline: bool,
    /// The same for the `aio` failure router
    /// (`> …AsyncFailureHandler<S> for Router<H> {`).
    pub aio_failure_router_for_inline: bool,
    /// The `aio` failure trait's header fits on one line.
    pub aio_failures_header_inline: bool,
}

#[derive(Debug, Clone)]
pub struct MethodView {
    /// The wire endpoint name, as in the contract: `EmployeeHired`.
    pub name: String,
    /// `employee_hired`.
    pub fn_name: String,
    /// `EmployeeHiredRequest`.
    pub request: String,
    pub docs: Vec<String>,
    pub deprecated: Option<String>,
    /// `Signal`, `PushCall` or `Command`: a `MessageType` variant.
    pub message_type: &'static str,
    /// "signal", "pushcall", "command", for docs.
    pub kind_doc: &'static str,
    pub params: Vec<FieldView>,
    /// The handler's success type: the response type or `()`.
    pub response_type: String,
    /// Whether the method declares a response (`-> T`).
    pub has_response: bool,
    /// An `Option<String>` expression over `request` giving the correlation key.
    pub correlation_expr: String,
    /// The same expression's method chain after `request` (`.employee`,
    /// `.id`, `.to_string()`), for the layout with one call per line; empty
    /// for `None`.
    pub correlation_segments: Vec<String>,
    /// The chain is wrapped in `Some(…)`.
    pub correlation_in_some: bool,
    /// `@delivery(max_retries = …)` as a Rust literal.
    pub max_retries: Option<String>,
    /// `@delivery(ttl = …)` as a `Duration` expression.
    pub ttl: Option<String>,
    /// The client function takes more arguments than clippy's
    /// `too_many_arguments` allows (`self`, `tx`, then one per parameter).
    pub client_too_many_args: bool,
    /// The handler function does (`self`, `call`, `tx`, then the parameters).
    pub handler_too_many_args: bool,
    /// Which of its width-dependent constructs fit on one line.
    pub layout: MethodLayout,
    /// The method as the `aio` submodule (the async API) writes it.
    pub aio: AioMethodView,
}

/// A method as the `aio` submodule of a service-version module writes it:
/// its types named from one module deeper, and the width decisions of the
/// async code. The client's message fields, at the same column as in the
/// blocking client, take [`MethodView::layout`]'s decisions.
#[derive(Debug, Clone)]
pub struct AioMethodView {
    /// The parameters, their types named from the `aio` module.
    pub params: Vec<FieldView>,
    /// The handler's success type, named from the `aio` module: the
    /// response type or `()`.
    pub response_type: String,
    pub layout: AioLayout,
}

impl AioMethodView {
    /// The success type on its own line of the handler's
    /// `Output = Result<…, HandlerError>` (which never fits on one line),
    /// broken as prettyplease breaks a long type.
    pub fn output_type(&self) -> std::borrow::Cow<'_, str> {
        super::layout::type_at(&self.response_type, 20, 20, ",".len())
    }

    /// The answer trait's `response: Type,` parameter type.
    pub fn answer_type(&self) -> std::borrow::Cow<'_, str> {
        let column = 16 + "response: ".len();
        super::layout::type_at(&self.response_type, 16, column, ",".len())
    }
}

/// The width decisions of one method's async code (made by
/// `layout::aio_method_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AioLayout {
    /// The client's `let request = super::R { a, b };` fits on one line.
    pub request_inline: bool,
    /// The receiver's `self.0.f(call, conn, …).await?;` fits on one line.
    pub receiver_call_inline: bool,
    /// Broken into one call per line, the `.f(call, conn, …)` line fits.
    pub receiver_args_inline: bool,
    /// The `Arc` impl's `(**self).f(call, conn, …)` fits on one line.
    pub forward_inline: bool,
    /// Broken after `(**self)`, the `.f(call, conn, …)` line fits.
    pub forward_args_inline: bool,
    /// The answer router's `self.0.f(answer, conn, response).await` fits.
    pub answer_call_inline: bool,
    /// Broken into one call per line, the `.f(answer, conn, response)` line fits.
    pub answer_args_inline: bool,
}

/// The layout decisions of one method's code that depend on the width of its
/// names (made by `layout::method_layout` with prettyplease's
/// margin), so that templates emit code already formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodLayout {
    /// The client's `let request = R { a, b };` fits on one line.
    pub request_inline: bool,
    /// The handler trait's `) -> Result<T, HandlerError>;` fits on one line.
    pub result_inline_decl: bool,
    /// The same with ` {` (the `Arc` forwarding impl) fits on one line.
    pub result_inline_impl: bool,
    /// The receiver's call of the handler fits on one line.
    pub receiver_call_inline: bool,
    /// Broken after `self` / `.0`, the `.f(call, tx, …)?;` line fits.
    pub receiver_args_inline: bool,
    /// The `Arc` impl's `(**self).f(call, tx, …)` fits on one line.
    pub forward_inline: bool,
    /// Broken after `(**self)`, the `.f(call, tx, …)` line fits.
    pub forward_args_inline: bool,
    /// The answer router's `self.0.f(answer, tx, response)` fits on one line.
    pub answer_call_inline: bool,
    /// Broken after `self.0`, the `.f(answer, tx, response)` line fits.
    pub answer_args_inline: bool,
    /// The client's `endpoint: "Name".to_owned(),` fits on one line.
    pub endpoint_inline: bool,
    /// The client's `correlation_id: <expr>,` fits on one line (else the
    /// chain is broken one call per line).
    pub correlation_inline: bool,
}

/// `templates/contracts.rs.askama`: the module tree that nests every package
/// by its dotted name and includes its file.
#[derive(Debug, Template)]
#[template(path = "contracts.rs.askama", escape = "none")]
pub struct ContractsTemplate {
    pub steps: Vec<TreeStep>,
    /// Include with `concat!(env!("OUT_DIR"), …)` (build scripts) rather than
    /// a path relative to the tree file (checked-in output).
    pub from_out_dir: bool,
}

/// One step of a depth-first walk over the package tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeStep {
    /// Open `pub mod <module> {`; `package` is set when a package ends here.
    Open {
        module: String,
        package: Option<String>,
    },
    /// Include the file of `package` (`<package>.rs`).
    Include {
        package: String,
    },
    Close,
}

/// Filters the templates use.
mod filters {
    /// A Rust string literal with the value's text (escaped as `{:?}` does).
    #[askama::filter_fn]
    pub fn rust_str(
        value: impl std::fmt::Display,
        _: &dyn askama::Values,
    ) -> askama::Result<String> {
        Ok(format!("{:?}", value.to_string()))
    }

    /// A raw string literal `r#"…"#` with enough `#` to hold the value as is.
    #[askama::filter_fn]
    pub fn rust_raw_str(
        value: impl std::fmt::Display,
        _: &dyn askama::Values,
    ) -> askama::Result<String> {
        let text = value.to_string();
        let mut hashes = 1;
        while text.contains(&format!("\"{}", "#".repeat(hashes))) {
            hashes += 1;
        }
        let fence = "#".repeat(hashes);
        Ok(format!("r{fence}\"{text}\"{fence}"))
    }
}
