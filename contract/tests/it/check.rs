//! The checker as a library: the model it builds from the language page's
//! example (`tests/ui/ok_spec_example`), and that one run reports the
//! problems of every file.

use std::path::PathBuf;

use rfidl_contract::ErrorCode;
use rfidl_contract::check::check_paths;
use rfidl_contract::manifest::{MethodKind, Scalar, TypeDef, TypeRef};

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

mod spans {
    //! Every diagnostic of any input points inside its file, on character
    //! boundaries, so rendering can never fail or slice a character: checked
    //! on line-level mutations of the UI inputs (which exercise syntax-error
    //! recovery across items).

    use proptest::prelude::*;
    use rfidl_contract::diagnostics::{FileId, render_human, render_json};
    use rfidl_contract::syntax::parse_file_all_errors;

    fn ui_inputs() -> Vec<String> {
        let mut inputs: Vec<String> = std::fs::read_dir("tests/ui")
            .expect("tests/ui")
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                (path.extension()? == "rfidl")
                    .then(|| std::fs::read_to_string(&path).ok())
                    .flatten()
            })
            .collect();
        inputs.sort();
        inputs
    }

    #[derive(Debug, Clone)]
    enum Edit {
        Delete(usize),
        Duplicate(usize),
        Swap(usize, usize),
        Insert(usize, &'static str),
        CutLine(usize, usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        let fragments = prop::sample::select(vec![
            "record",
            "}",
            "{",
            "enum E {",
            "service S v1 {",
            "import \"",
            "\"",
            "///",
            "@",
            "->",
            "list<",
            "map<string,",
            "?",
            "ä€😀",
            "\t",
            "\r",
            "package x;",
        ]);
        prop_oneof![
            any::<usize>().prop_map(Edit::Delete),
            any::<usize>().prop_map(Edit::Duplicate),
            (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::Swap(a, b)),
            (any::<usize>(), fragments).prop_map(|(at, text)| Edit::Insert(at, text)),
            (any::<usize>(), any::<usize>()).prop_map(|(line, at)| Edit::CutLine(line, at)),
        ]
    }

    fn apply(text: &str, edits: &[Edit]) -> String {
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        for edit in edits {
            if lines.is_empty() {
                break;
            }
            let n = lines.len();
            match edit {
                Edit::Delete(i) => {
                    lines.remove(i % n);
                }
                Edit::Duplicate(i) => lines.insert(i % n, lines[i % n].clone()),
                Edit::Swap(a, b) => lines.swap(a % n, b % n),
                Edit::Insert(i, fragment) => lines.insert(i % (n + 1), (*fragment).to_owned()),
                Edit::CutLine(i, at) => {
                    let line = &mut lines[i % n];
                    let cut = line
                        .char_indices()
                        .map(|(i, _)| i)
                        .nth(at % (line.chars().count() + 1))
                        .unwrap_or(line.len());
                    line.truncate(cut);
                }
            }
        }
        lines.join("\n")
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn diagnostics_point_inside_the_text(
            index in any::<prop::sample::Index>(),
            edits in prop::collection::vec(edit(), 1..6),
        ) {
            let inputs = ui_inputs();
            let input: &String = index.get(&inputs);
            let text = apply(input, &edits);
            let Err(errors) = parse_file_all_errors(FileId::default(), &text) else {
                return Ok(());
            };
            prop_assert!(!errors.is_empty());
            prop_assert!(errors.len() <= rfidl_contract::syntax::MAX_SYNTAX_ERRORS);
            let mut sources = rfidl_contract::SourceMap::new();
            sources.add("x.rfidl", "x.rfidl", text.clone());
            let mut previous_start = 0;
            for error in &errors {
                let spans = error.span.iter().chain(error.secondary.iter().map(|(s, _)| s));
                for span in spans {
                    prop_assert!(span.start <= span.end && span.end <= text.len(), "{span:?}");
                    prop_assert!(text.is_char_boundary(span.start) && text.is_char_boundary(span.end));
                }
                let start = error.span.map_or(0, |s| s.start);
                prop_assert!(start >= previous_start, "errors come in text order");
                previous_start = start;
                prop_assert!(!render_human(&sources, error).is_empty());
                prop_assert!(!render_json(&sources, error).is_empty());
            }
        }
    }
}
