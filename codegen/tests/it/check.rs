//! The checker as a library: the model it builds from the language page's
//! example (`tests/ui/ok_spec_example`), and that one run reports the
//! problems of every file.

use std::path::PathBuf;

use rfidl_codegen::ErrorCode;
use rfidl_codegen::check::check_paths;
use rfidl_codegen::manifest::{MethodKind, Scalar, TypeDef, TypeRef};

#[test]
fn the_model_of_the_spec_example_is_resolved() {
    let outcome = check_paths(&[PathBuf::from("tests/ui/ok_spec_example/main.rfidl")])
        .expect("the example is readable");
    assert!(!outcome.has_errors(), "{}", outcome.render_human());
    let model = outcome.model.expect("no errors means a model");

    let names: Vec<&str> = model.packages.iter().map(|p| p.package.as_str()).collect();
    assert_eq!(
        names,
        ["common", "hr.employees"],
        "packages are sorted by name"
    );
    let hr = model.package("hr.employees").expect("hr.employees");
    let types: Vec<&str> = hr.types.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        types,
        [
            "hr.employees.Employee",
            "hr.employees.EmploymentStatus",
            "hr.employees.HireAck",
            "hr.employees.LaptopTicket"
        ],
        "types in source order"
    );

    let v1 = model
        .service("hr.employees.EmpService", 1)
        .expect("EmpService v1");
    let hired = v1
        .methods
        .iter()
        .find(|m| m.name == "EmployeeHired")
        .expect("EmployeeHired");
    assert_eq!(hired.kind, MethodKind::Pushcall);
    assert_eq!(
        hired.correlate.as_deref(),
        Some(&["employee".to_owned(), "id".to_owned()][..])
    );
    let delivery = hired.delivery.as_ref().expect("@delivery");
    assert_eq!(delivery.max_retries, Some(10));
    assert_eq!(delivery.ttl_ms, Some(48 * 3_600_000));
    assert!(model.service("hr.employees.EmpService", 2).is_none());
    // The manifest holds the closure of the types its methods use.
    let closure: Vec<&str> = v1.types.keys().map(String::as_str).collect();
    assert_eq!(
        closure,
        [
            "common.Money",
            "hr.employees.Employee",
            "hr.employees.EmploymentStatus",
            "hr.employees.HireAck",
            "hr.employees.LaptopTicket"
        ]
    );

    // Qualified names resolve to the declaring package.
    let Some(TypeDef::Record { fields, .. }) = model.type_def("hr.employees.Employee") else {
        panic!("Employee is a record");
    };
    let salary = fields.iter().find(|f| f.name == "salary").expect("salary");
    assert_eq!(salary.ty, TypeRef::Named("common.Money".to_owned()));
    let email = fields.iter().find(|f| f.name == "email").expect("email");
    assert_eq!(
        email.ty,
        TypeRef::Optional(Box::new(TypeRef::Scalar(Scalar::String)))
    );
    assert!(matches!(
        model.type_def("common.Money"),
        Some(TypeDef::Record { .. })
    ));
    assert!(model.type_def("common.Nope").is_none());
}

#[test]
fn one_run_reports_the_errors_of_every_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let broken_syntax = write("a.rfidl", "package a;\nrecord A { id uuid }\n");
    let bad_types = write(
        "b.rfidl",
        "package b;\nrecord B { x: Strin, y: map<i32, string> }\n",
    );
    let bad_service = write(
        "c.rfidl",
        "package c;\nservice S v0 { signal s() -> uuid; }\n",
    );
    let outcome =
        check_paths(&[broken_syntax, bad_types, bad_service]).expect("inputs are readable");
    let codes: Vec<ErrorCode> = outcome.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(
        codes,
        vec![
            ErrorCode::Syntax,
            ErrorCode::UnknownType,
            ErrorCode::MapKeyNotString,
            ErrorCode::InvalidVersion,
            ErrorCode::NotUpperCamelCase,
            ErrorCode::SignalWithResponse,
        ],
        "{}",
        outcome.render_human()
    );
    assert!(outcome.model.is_none());
}

#[test]
fn warnings_alone_still_build_the_model() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("w.rfidl");
    std::fs::write(
        &path,
        "package w;\n@deprecated(\"use B\")\nrecord A {}\nrecord B { a: A }\n",
    )
    .expect("write");
    let outcome = check_paths(&[path]).expect("readable");
    assert!(!outcome.has_errors());
    assert_eq!(outcome.diagnostics.len(), 1);
    assert_eq!(outcome.diagnostics[0].code, ErrorCode::DeprecatedUse);
    assert!(outcome.model.is_some());
}
