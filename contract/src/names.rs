//! The Rust names generated code gives to contract names, and the names it
//! takes for itself.
//!
//! This module sits below both the checker and the generator: the generator
//! (`rfidl_codegen::generate::plan`) names everything through these functions,
//! and the checker's collision rules (E0014, E0015, E0026) call the same
//! ones, so the checker refuses exactly the contracts whose generated names
//! would clash: the two can never disagree.

use heck::{ToSnakeCase, ToUpperCamelCase};

/// Rust keywords that can be raw identifiers (`r#type`).
const RAW_KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "dyn", "else", "enum", "extern", "false",
    "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "static", "struct", "trait", "true", "type", "unsafe", "use", "where",
    "while", "abstract", "become", "box", "do", "final", "macro", "override", "priv", "try",
    "typeof", "unsized", "virtual", "yield",
];
/// Keywords that cannot be raw identifiers: they get a trailing underscore.
const RESERVED: &[&str] = &["self", "Self", "super", "crate", "_"];

/// A contract name as a Rust identifier: raw for keywords, `_`-suffixed for
/// the few that cannot be raw.
pub fn rust_ident(name: &str) -> String {
    if RESERVED.contains(&name) {
        format!("{name}_")
    } else if RAW_KEYWORDS.contains(&name) {
        format!("r#{name}")
    } else {
        name.to_owned()
    }
}

/// The Rust type of a record or enum: its name as written.
pub fn type_name(name: &str) -> String {
    rust_ident(name)
}

/// The Rust variant of an enum variant: its name as written.
pub fn variant_name(name: &str) -> String {
    rust_ident(name)
}

/// The Rust field of a record field, or of a method parameter (a field of the
/// method's request struct and an argument of its client and handler
/// functions): its name as written. The JSON member keeps the contract name.
pub fn field_name(name: &str) -> String {
    rust_ident(name)
}

/// The client and handler function of a method: `EmployeeHired` -> `employee_hired`.
pub fn method_fn_name(method: &str) -> String {
    rust_ident(&method.to_snake_case())
}

/// The request struct of a method, in its service-version module:
/// `EmployeeHired` -> `EmployeeHiredRequest`.
pub fn request_struct_name(method: &str) -> String {
    format!("{}Request", method.to_upper_camel_case())
}

/// The module of a service version, inside its package's module:
/// `EmpService` v1 -> `emp_service_v1`.
pub fn service_module(service: &str, version: u32) -> String {
    format!("{}_v{version}", service.to_snake_case())
}

/// The module of one package segment: `hr.employees` -> `hr`, `employees`.
pub fn package_module(segment: &str) -> String {
    rust_ident(segment)
}

/// What a package module imports by name for its own code
/// (`use ::rfidl_runtime::serde::{Deserialize, Serialize};`): a record or enum
/// of that name would clash with the import.
pub const PACKAGE_MODULE_IMPORTS: &[&str] = &["Deserialize", "Serialize"];

/// Prelude traits the code in service-version modules names unqualified
/// (`Send + Sync`, `?Sized`, `impl Into<…>`). Those modules `use super::*`,
/// so a record or enum of the package with one of these names would shadow
/// the trait there.
pub const PRELUDE_TRAITS_USED: &[&str] = &["Into", "Send", "Sized", "Sync"];

/// The arguments every generated client function (`tx`) and handler method
/// (`call`, `tx`) takes before the method's parameters; in the async API
/// (the `aio` modules) `conn` stands for `tx`.
pub const CALL_ARGUMENTS: &[&str] = &["call", "tx", "conn"];

/// Functions of the generated clients besides one per method: the
/// constructors (`new` for the default store, `with_store` for any) and the
/// durable-timer views (`deliver_at`, `deliver_after`).
pub const CLIENT_FUNCTIONS: &[&str] = &["new", "with_store", "deliver_at", "deliver_after"];

// The types each service-version module defines. `Engine…` types carry the
// methods sent to the engine (signals and pushcalls), `Service…` types the
// methods sent to the service (commands).

/// The client the service uses to send signals and pushcalls to the engine
/// (one function per method, each enqueueing into the caller's transaction).
pub const ENGINE_CLIENT: &str = "EngineClient";
/// The trait the engine implements to handle signals and pushcalls (one
/// method per contract method).
pub const ENGINE_HANDLER: &str = "EngineHandler";
/// The engine's receiver: decodes incoming signals and pushcalls and calls
/// its [`ENGINE_HANDLER`].
pub const ENGINE_RECEIVER: &str = "EngineReceiver";
/// The client the engine uses to send commands to the service.
pub const SERVICE_CLIENT: &str = "ServiceClient";
/// The trait the service implements to handle commands.
pub const SERVICE_HANDLER: &str = "ServiceHandler";
/// The service's receiver: decodes incoming commands and calls its
/// [`SERVICE_HANDLER`].
pub const SERVICE_RECEIVER: &str = "ServiceReceiver";
/// The trait the service implements to act on the engine's answers to its
/// pushcalls (one method per pushcall with a response).
pub const ENGINE_ANSWERS: &str = "EngineAnswers";
/// The dispatcher glue that routes the engine's answers to an
/// [`ENGINE_ANSWERS`] implementation.
pub const ENGINE_ANSWER_ROUTER: &str = "EngineAnswerRouter";
/// The trait the engine implements to act on the service's answers to its
/// commands (one method per command with a response).
pub const SERVICE_ANSWERS: &str = "ServiceAnswers";
/// The dispatcher glue that routes the service's answers to a
/// [`SERVICE_ANSWERS`] implementation.
pub const SERVICE_ANSWER_ROUTER: &str = "ServiceAnswerRouter";
/// The trait the service implements to act on its signals and pushcalls
/// that end `Failed`, `DeadLetter` or `Expired` (one method per method).
pub const ENGINE_FAILURES: &str = "EngineFailures";
/// The dispatcher glue that routes those failures to an
/// [`ENGINE_FAILURES`] implementation.
pub const ENGINE_FAILURE_ROUTER: &str = "EngineFailureRouter";
/// The trait the engine implements to act on its commands that end
/// `Failed`, `DeadLetter` or `Expired` (one method per command).
pub const SERVICE_FAILURES: &str = "ServiceFailures";
/// The dispatcher glue that routes those failures to a
/// [`SERVICE_FAILURES`] implementation.
pub const SERVICE_FAILURE_ROUTER: &str = "ServiceFailureRouter";

/// Types a service-version module defines or imports besides the request
/// structs: a request struct cannot take one of these names.
pub const SERVICE_MODULE_TYPES: &[&str] = &[
    ENGINE_CLIENT,
    ENGINE_HANDLER,
    ENGINE_RECEIVER,
    SERVICE_CLIENT,
    SERVICE_HANDLER,
    SERVICE_RECEIVER,
    ENGINE_ANSWERS,
    ENGINE_ANSWER_ROUTER,
    SERVICE_ANSWERS,
    SERVICE_ANSWER_ROUTER,
    ENGINE_FAILURES,
    ENGINE_FAILURE_ROUTER,
    SERVICE_FAILURES,
    SERVICE_FAILURE_ROUTER,
    "Deserialize",
    "Serialize",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_escape_keywords() {
        assert_eq!(rust_ident("type"), "r#type");
        assert_eq!(rust_ident("self"), "self_");
        assert_eq!(rust_ident("name"), "name");
    }

    #[test]
    fn derived_names() {
        assert_eq!(method_fn_name("EmployeeHired"), "employee_hired");
        assert_eq!(method_fn_name("Type"), "r#type");
        assert_eq!(request_struct_name("GetURL"), "GetUrlRequest");
        assert_eq!(service_module("EmpService", 1), "emp_service_v1");
        assert_eq!(service_module("EMPService", 1), "emp_service_v1");
        assert_eq!(package_module("self"), "self_");
    }
}
