//! The generator's templates emit code already laid out as prettyplease
//! prints it, and use that text without parsing it (see
//! `codegen/src/generate/layout.rs`). These tests prove the layout right:
//! every item the fast path vouches for must be a fixed point of
//! prettyplease (`unparse(parse_file(text)) == text`), on every contract set
//! the tests have and on contracts whose names, parameter counts, types and
//! doc comments are swept across the margin, so that every width decision
//! is taken both ways.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rfidl_codegen::generate::fast_items;
use rfidl_codegen::manifest::PackageContract;
use rfidl_codegen::{Options, Sides};

use crate::support::model_of;

#[path = "../../benches/contract_set.rs"]
mod contract_set;

/// Checks every fast item of `packages`; returns (fast items, fallbacks).
fn assert_fixed_point(packages: &[PackageContract]) -> (usize, usize) {
    assert_fixed_point_with(packages, &Options::default())
}

fn assert_fixed_point_with(packages: &[PackageContract], options: &Options) -> (usize, usize) {
    let items = fast_items(packages, options).expect("renders");
    let (mut fast, mut fallbacks) = (0, 0);
    for item in items {
        let Some(text) = item.text else {
            fallbacks += 1;
            if std::env::var_os("RFIDL_SHOW_FALLBACKS").is_some() {
                let long = rfidl_codegen::generate::layout::unvouched_line(&item.rendered);
                eprintln!("fallback {}: {long:?}", item.what);
            }
            continue;
        };
        fast += 1;
        let file = syn::parse_file(&text)
            .unwrap_or_else(|error| panic!("{}: not valid Rust ({error}):\n{text}", item.what));
        let pretty = prettyplease::unparse(&file);
        if pretty != text {
            let line = pretty
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let context = |s: &str| {
                s.lines()
                    .skip(line.saturating_sub(3))
                    .take(8)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            panic!(
                "{}: the fast layout is not prettyplease's, from line {}:\n--- fast\n{}\n--- prettyplease\n{}",
                item.what,
                line + 1,
                context(&text),
                context(&pretty)
            );
        }
    }
    (fast, fallbacks)
}

fn model_of_texts(files: &[(String, String)]) -> Vec<PackageContract> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut roots = Vec::new();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        roots.push(path);
    }
    model_of(&roots).packages
}

#[test]
fn the_fast_layout_of_the_schemas_is_prettypleases() {
    let model = model_of(&[PathBuf::from("../schemas")]);
    let (fast, _) = assert_fixed_point(&model.packages);
    assert!(fast >= 10, "only {fast} items took the fast path");
}

/// One side only: the service modules lose the other side's client or
/// handler, receiver and answers.
#[test]
fn the_fast_layout_of_one_side_is_prettypleases() {
    let model = model_of(&[PathBuf::from("../schemas")]);
    for sides in [Sides::Service, Sides::Engine] {
        let mut options = Options::default();
        options.sides = sides;
        let (fast, _) = assert_fixed_point_with(&model.packages, &options);
        assert!(
            fast >= 10,
            "{sides:?}: only {fast} items took the fast path"
        );
    }
}

#[test]
fn the_fast_layout_of_the_edge_case_corpus_is_prettypleases() {
    let model = model_of(&[Path::new("tests/corpus/edge_cases.rfidl").to_path_buf()]);
    let (fast, _) = assert_fixed_point(&model.packages);
    assert!(fast > 0, "no item took the fast path");
}

#[test]
fn the_benchmark_set_takes_the_fast_path_and_it_is_prettypleases() {
    let files = contract_set::contract_texts(contract_set::SetSize {
        packages: 2,
        services_per_package: 3,
        methods_per_service: 4,
        records_per_package: 3,
    });
    let (fast, fallbacks) = assert_fixed_point(&model_of_texts(&files));
    assert_eq!(
        fallbacks, 0,
        "the benchmark's shapes all take the fast path"
    );
    assert_eq!(fast, 2 + 2 * (3 + 3), "every record, enum and service");
}

/// `len` letters after `prefix`: `name("M", 4)` is `Maaa`.
fn name(prefix: &str, len: usize) -> String {
    let mut name = prefix.to_owned();
    name.extend(std::iter::repeat_n('a', len.saturating_sub(prefix.len())));
    name
}

/// One service per variation, so that one item falling back hides nothing
/// else: method names, parameter counts and names, response types, record
/// and field names of every width from short to past the margin.
fn sweep_contract() -> String {
    let mut text = String::from("/// Widths swept across the margin.\npackage sweep;\n\n");
    // Records named R, Ra, Raa, … (response types of every width), each with
    // a field whose name and type grow with it.
    for len in 1..=48 {
        let record = name("R", len);
        let _ = write!(
            text,
            "/// Record of width {len}.\nrecord {record} {{\n    {}: list<{}>,\n    opt: map<string, {}>?,\n}}\n\n",
            name("f", len),
            if len > 1 {
                name("R", len - 1)
            } else {
                "string".to_owned()
            },
            if len > 1 {
                name("R", len - 1)
            } else {
                "string".to_owned()
            },
        );
    }
    text.push_str("enum E {\n    /// A variant.\n    A,\n    Bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb,\n}\n\n");
    text.push_str("/// Nothing in it.\nrecord Nothing {}\n\n");
    // Method names of every width, each kind, two parameters.
    for len in 1..=64 {
        let method = name("M", len);
        let _ = write!(
            text,
            "/// Method width {len}.\nservice N{len} v1 {{\n    \
             /// A signal.\n    @correlate(a)\n    signal {method}(a: string, bb: u32);\n\n    \
             pushcall P{method}(a: string, bb: u32) -> {};\n\n    \
             command C{method}(a: string?, bb: u32) -> list<{}>;\n}}\n\n",
            name("R", len.min(48)),
            name("R", (len / 2).max(1)),
        );
    }
    // Parameter counts 0 to 12, with names of growing width.
    for count in 0..=12 {
        for width in [1, 6, 14] {
            let params: Vec<String> = (0..count)
                .map(|i| {
                    format!(
                        "{}: {}",
                        name(&format!("p{i}"), width),
                        if i % 2 == 0 { "string" } else { "Ra?" }
                    )
                })
                .collect();
            let _ = write!(
                text,
                "service P{count}w{width} v1 {{\n    \
                 signal Sig({params});\n\n    \
                 pushcall Push({params}) -> Raaaaaaaaaa;\n\n    \
                 command Cmd({params}) -> string;\n}}\n\n",
                params = params.join(", ")
            );
        }
    }
    // Long generic types in parameters and responses: one module deeper and
    // four columns further in, the `aio` functions break them where the
    // blocking ones keep them on one line.
    for len in [4, 6] {
        let ty = format!("map<string, list<{}>>?", name("R", len));
        let _ = write!(
            text,
            "service O{len} v1 {{\n    signal Put(m: {ty});\n\n    pushcall Get(a: u32) -> {ty};\n}}\n\n"
        );
    }
    // Endpoint lists of every length (inline or one name per line).
    for count in 1..=9 {
        let _ = writeln!(text, "service E{count} v1 {{");
        for m in 0..count {
            let _ = write!(
                text,
                "    signal Sig{m}(a: u32);\n    command Cmd{m}(a: u32);\n"
            );
        }
        text.push_str("}\n\n");
    }
    // Correlation paths through optional fields (`as_ref`, `map`,
    // `and_then` chains) of growing length.
    text.push_str(
        "record Node {\n    id: uuid,\n    next: Node?,\n    first: Leaf,\n}\n\n\
         record Leaf {\n    id: uuid,\n    next: Node?,\n}\n\n",
    );
    for width in [1, 8, 16, 40] {
        for path in [
            "next.id",
            "first.id",
            "next.next.id",
            "first.next.first.id",
            "next.first.next.id",
            "next.next.next.id",
        ] {
            let param = name("n", width);
            let _ = write!(
                text,
                "service C{width}{} v1 {{\n    @correlate({param}.{path})\n    \
                 signal Sig(a: u32, {param}: Node?);\n\n    \
                 @correlate({param}.{path})\n    pushcall Push({param}: Node) -> Node;\n}}\n\n",
                path.replace('.', "x"),
            );
        }
    }
    // Long doc comments, a trailing space, an empty doc line, deprecation.
    let long_doc = "word ".repeat(40);
    let _ = write!(
        text,
        "/// {long_doc}\n///\n/// Trailing space. \n@deprecated(\"{}\")\nservice Docs v1 {{\n    /// {long_doc}\n    \
         @deprecated(\"short\")\n    pushcall Documented(\n        /// {long_doc}\n        a: string,\n    ) -> Ra;\n}}\n",
        "why ".repeat(5)
    );
    text
}

#[test]
fn the_fast_layout_is_prettypleases_across_every_width_threshold() {
    let files = [("sweep.rfidl".to_owned(), sweep_contract())];
    let (fast, fallbacks) = assert_fixed_point(&model_of_texts(&files));
    // Most items must take the fast path, or the sweep would prove little;
    // the others are the widest names, past what the fast layout models.
    assert!(
        fast > 2 * fallbacks,
        "{fast} fast items against {fallbacks} fallbacks"
    );
    eprintln!("sweep: {fast} fast items, {fallbacks} fallbacks");
    // Each width decision was taken both ways on the fast path (the broken
    // forms; the one-line forms are in every item above).
    let packages = model_of_texts(&files);
    let fast_text: String = fast_items(&packages, &Options::default())
        .expect("renders")
        .into_iter()
        .filter_map(|item| item.text)
        .collect();
    for broken in [
        "            let request = MaaaaaaaaaaaaaaaaaaaaaaaRequest {\n                a,\n",
        "                    correlation_id: Some(\n                        request\n",
        "                    correlation_id: request\n                        .",
        "                    let response = self\n                        .0\n                        .p_",
        "                        .0\n                        .push(\n                            call,\n",
        "                    self.0\n                        .maa",
        "                    self.0\n                        .sig(\n                            call,\n",
        "            (**self)\n                .sig(call, tx, ",
        "            (**self)\n                .sig(\n                    call,\n",
        "        endpoints: &[\n            \"",
        "    pub opt: Option<\n        ::std::collections::BTreeMap<String, Raaa",
        "    pub opt: Option<\n        ::std::collections::BTreeMap<\n            String,\n",
        "                    endpoint: \"Maaaa",
        "\n                        .to_owned(),\n",
        "                    self.0\n                        .p_maa",
        "(\n                            answer,\n",
        "                    endpoints: &[\n                        \"",
        "        ) -> ::std::result::Result<\n            super::Raa",
        // The `aio` module's.
        "                let request = super::MaaaaaaaaaaaaaaaaaaaaaaaRequest {\n                    a,\n",
        "                            let response = self\n                                .0\n                                .p_",
        "                                .push(\n                                    call,\n                                    conn,\n",
        "                            self.0\n                                .maa",
        "                            self.0\n                                .sig(\n                                    call,\n",
        "                (**self)\n                    .sig(call, conn, ",
        "                (**self)\n                    .sig(\n                        call,\n",
        "                        endpoints: &[\n                            \"",
        "(answer, conn, response)\n                                .await\n",
        "(\n                                    answer,\n                                    conn,\n",
        "                m: Option<\n                    ::std::collections::BTreeMap<",
        "                response: Option<\n",
        "                Output = ::std::result::Result<\n                    Option<\n",
        "        > ::rfidl_runtime::responses::AsyncResponseHandler<S>\n        for ServiceAnswerRouter<H> {",
    ] {
        assert!(
            fast_text.contains(broken),
            "no fast item has the broken layout {broken:?}"
        );
    }
}
