//! Rust code generation: model -> template views -> askama, whose templates
//! emit code already laid out as prettyplease prints it ([`layout`] makes the
//! width decisions); an item the fast layout cannot vouch for goes through
//! syn + prettyplease instead.
//!
//! Owns the layout of generated code. Never reads files or the network: it
//! gets a checked model and returns file names with their contents; writing
//! them (only when changed) is the caller's job.

// The generator's machinery: the template views (`templates`), how they are
// planned from the model (`plan`) and the width decisions (`layout`). Public
// only for the benchmark (`benches/check.rs` times each phase) and the layout
// tests (`tests/it/fast_layout.rs`); not part of the API, and free to change
// in any release.
#[doc(hidden)]
pub mod layout;
pub mod options;
#[doc(hidden)]
pub mod plan;
#[doc(hidden)]
pub mod templates;

pub use options::{GeneratedFile, Options, Sides};
/// The naming rules moved below the checker and the generator; this path
/// stays for callers of `generate::names`.
pub use rfidl_contract::names;

use askama::Template;

use crate::manifest::PackageContract;

/// Where the generated tree file finds the package files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A build script's `OUT_DIR`: tree file `rfidl_contracts.rs`, included with
    /// `rfidl_runtime::include_contracts!()`; packages with `include_contract!`.
    OutDir,
    /// A source folder (`rfidl generate --out DIR`): tree file `mod.rs`, so the
    /// folder is a module (`mod generated;`), with each package beside it.
    SourceDir,
}

impl Layout {
    /// The file that nests every package module.
    pub fn tree_file(self) -> &'static str {
        match self {
            Layout::OutDir => "rfidl_contracts.rs",
            Layout::SourceDir => "mod.rs",
        }
    }
}

/// Every file generated for `contracts`: one Rust file per package, the
/// module tree, and each service version's manifest as JSON and YAML under
/// `manifests/`. Sorted by name, so output order is stable.
///
/// Every record, enum and service module is rendered and formatted on its
/// own (see [`render_package`]), on up to
/// [`std::thread::available_parallelism`] threads; the output does not
/// depend on the number of threads.
pub fn generate_files(
    contracts: &[PackageContract],
    options: &Options,
    layout: Layout,
) -> Result<Vec<GeneratedFile>, GenerateError> {
    generate_files_with_stats(contracts, options, layout).map(|(files, _)| files)
}

/// How [`generate_files_with_stats`] produced the Rust items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerateStats {
    /// Records, enums, service modules and package preludes rendered.
    pub items: usize,
    /// Of those, the items whose fast layout had a line [`layout`] cannot
    /// vouch for, so they were formatted by syn + prettyplease.
    pub fallbacks: usize,
}

/// [`generate_files`], and how many items took the syn + prettyplease
/// fallback (the benchmark prints it).
pub fn generate_files_with_stats(
    contracts: &[PackageContract],
    options: &Options,
    layout: Layout,
) -> Result<(Vec<GeneratedFile>, GenerateStats), GenerateError> {
    let threads = std::thread::available_parallelism().unwrap_or(std::num::NonZero::<usize>::MIN);
    generate_files_on_threads(contracts, options, layout, threads)
}

/// [`generate_files_with_stats`] on at most `threads` threads rather than
/// [`std::thread::available_parallelism`] (the benchmark compares both; the
/// output is the same).
pub fn generate_files_on_threads(
    contracts: &[PackageContract],
    options: &Options,
    layout: Layout,
    threads: std::num::NonZero<usize>,
) -> Result<(Vec<GeneratedFile>, GenerateStats), GenerateError> {
    let deprecated = plan::deprecated_types(contracts);
    let views: Vec<templates::PackageTemplate> = contracts
        .iter()
        .map(|contract| plan::plan_package_with(contract, options, &deprecated))
        .collect();
    // One unit of work per item (and per manifest file), so that one large
    // package is spread over the threads too.
    let mut units = Vec::new();
    for (contract, view) in contracts.iter().zip(&views) {
        units.extend(package_units(&contract.package, view));
        for manifest in &contract.services {
            units.push(Unit::Json(manifest));
            units.push(Unit::Yaml(manifest));
        }
    }
    let mut done = parallel_map(threads.get(), &units, Unit::run).into_iter();
    let mut files = Vec::new();
    let mut stats = GenerateStats::default();
    for (contract, view) in contracts.iter().zip(&views) {
        let mut text = String::new();
        for _ in 0..item_count(view) {
            let item = done.next().expect("one result per unit")?;
            stats.items += 1;
            stats.fallbacks += usize::from(item.fallback);
            text.push_str(&item.text);
        }
        files.push(GeneratedFile {
            name: format!("{}.rs", contract.package),
            contents: with_header(&text),
        });
        drop(text);
        for manifest in &contract.services {
            let stem = format!("manifests/{}.v{}", manifest.interface, manifest.version);
            files.push(GeneratedFile {
                name: format!("{stem}.json"),
                contents: done.next().expect("one result per unit")?.text,
            });
            files.push(GeneratedFile {
                name: format!("{stem}.yaml"),
                contents: done.next().expect("one result per unit")?.text,
            });
        }
    }
    let packages: Vec<&str> = contracts.iter().map(|c| c.package.as_str()).collect();
    let tree = templates::ContractsTemplate {
        steps: plan::plan_tree(&packages),
        from_out_dir: layout == Layout::OutDir,
    };
    let text = tree.render().map_err(|source| GenerateError::Render {
        template: "contracts.rs.askama",
        source,
    })?;
    files.push(GeneratedFile {
        name: layout.tree_file().to_owned(),
        contents: format_rust("the module tree", &text)?,
    });
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((files, stats))
}

/// One rendered unit: its text, and whether it took the fallback.
struct Rendered {
    text: String,
    fallback: bool,
}

impl Rendered {
    fn fast(text: String) -> Self {
        Rendered {
            text,
            fallback: false,
        }
    }
}

/// One record, enum or service module of a package, as the fast templates
/// lay it out (for tests that compare it with prettyplease's layout).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct FastItem {
    /// `package: Name` of the item.
    pub what: String,
    /// The template's output as rendered.
    pub rendered: String,
    /// The item's text; `None` when [`layout`] cannot vouch for it (the
    /// generator then formats the template's output with prettyplease).
    pub text: Option<String>,
}

/// Every record, enum and service module of `contracts` as the fast
/// templates lay it out, without the fallback. Generation uses the text of
/// each item that has one as it is; `tests/it/fast_layout.rs` checks that
/// prettyplease prints each of them unchanged.
#[doc(hidden)]
pub fn fast_items(
    contracts: &[PackageContract],
    options: &Options,
) -> Result<Vec<FastItem>, GenerateError> {
    let deprecated = plan::deprecated_types(contracts);
    let mut items = Vec::new();
    for contract in contracts {
        let view = plan::plan_package_with(contract, options, &deprecated);
        let package = &contract.package;
        let named = view
            .records
            .iter()
            .map(|r| (&r.name, Unit::Record(package, r)))
            .chain(view.enums.iter().map(|e| (&e.name, Unit::Enum(package, e))))
            .chain(
                view.services
                    .iter()
                    .map(|s| (&s.module, Unit::Service(package, s))),
            );
        for (name, unit) in named {
            let (template, rendered) = unit.render_fast()?;
            items.push(FastItem {
                what: format!("{package}: {name} ({template})"),
                text: unit.vouched(&rendered),
                rendered,
            });
        }
    }
    Ok(items)
}

/// One piece of generated output, produced independently of the others.
enum Unit<'a> {
    /// The `use` line that opens every package module.
    Prelude,
    Record(&'a str, &'a templates::RecordView),
    Enum(&'a str, &'a templates::EnumView),
    Service(&'a str, &'a templates::ServiceView),
    Json(&'a crate::manifest::Manifest),
    Yaml(&'a crate::manifest::Manifest),
}

impl Unit<'_> {
    fn run(&self) -> Result<Rendered, GenerateError> {
        match self {
            Unit::Prelude => Ok(Rendered::fast(PRELUDE.to_owned())),
            Unit::Record(package, _) | Unit::Enum(package, _) | Unit::Service(package, _) => {
                let (_, rendered) = self.render_fast()?;
                Ok(match self.vouched(&rendered) {
                    Some(text) => Rendered::fast(text),
                    None => Rendered {
                        text: format_items(package, &rendered)?,
                        fallback: true,
                    },
                })
            }
            Unit::Json(manifest) => Ok(Rendered::fast(manifest.to_pretty_json() + "\n")),
            Unit::Yaml(manifest) => Ok(Rendered::fast(manifest.to_yaml())),
        }
    }

    /// The fast layout of this unit's template output, or `None` when it
    /// must go through syn + prettyplease: a line [`layout`] cannot vouch
    /// for, or text the contract's checker never saw (derives and attributes
    /// from [`crate::Builder::type_derive`] / `type_attribute`, which syn
    /// must validate and prettyplease lay out).
    fn vouched(&self, rendered: &str) -> Option<String> {
        let user_text = match self {
            Unit::Record(_, record) => {
                !record.extra_derives.is_empty() || !record.extra_attributes.is_empty()
            }
            Unit::Enum(_, enumeration) => {
                !enumeration.extra_derives.is_empty() || !enumeration.extra_attributes.is_empty()
            }
            _ => false,
        };
        if user_text {
            return None;
        }
        layout::check_item(rendered)
    }

    /// A record's, enum's or service's template output, and the template's
    /// name; empty for the other units.
    fn render_fast(&self) -> Result<(&'static str, String), GenerateError> {
        let (template, view): (&'static str, &dyn askama::DynTemplate) = match self {
            Unit::Record(_, record) => ("record.rs.askama", &templates::RecordTemplate { record }),
            Unit::Enum(_, enumeration) => {
                ("enum.rs.askama", &templates::EnumTemplate { enumeration })
            }
            Unit::Service(_, service) => {
                ("service.rs.askama", &templates::ServiceTemplate { service })
            }
            Unit::Prelude | Unit::Json(_) | Unit::Yaml(_) => return Ok(("", String::new())),
        };
        let text = view
            .dyn_render()
            .map_err(|source| GenerateError::Render { template, source })?;
        Ok((template, text))
    }
}

/// What `templates/package.rs.askama` puts above a package's items.
const PRELUDE: &str =
    "#[allow(unused_imports)]\nuse ::rfidl_runtime::serde::{Deserialize, Serialize};\n";

/// A package module's items in file order: the prelude, records, enums,
/// service modules (as `templates/package.rs.askama` lays them out).
fn package_units<'a>(
    package: &'a str,
    view: &'a templates::PackageTemplate,
) -> impl Iterator<Item = Unit<'a>> {
    std::iter::once(Unit::Prelude)
        .chain(view.records.iter().map(move |r| Unit::Record(package, r)))
        .chain(view.enums.iter().map(move |e| Unit::Enum(package, e)))
        .chain(view.services.iter().map(move |s| Unit::Service(package, s)))
}

fn item_count(view: &templates::PackageTemplate) -> usize {
    1 + view.records.len() + view.enums.len() + view.services.len()
}

/// `f` over every item, on up to `threads` threads, results in the items' order.
fn parallel_map<T: Sync, R: Send>(
    threads: usize,
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let workers = threads.min(items.len());
    if workers <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(index) else {
                            break done;
                        };
                        done.push((index, f(item)));
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| match thread.join() {
                Ok(done) => done,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    done.sort_unstable_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, result)| result).collect()
}

/// The first line of every generated file.
pub const GENERATED_HEADER: &str =
    "// @generated by rfidl-codegen. Do not edit: change the contract and regenerate.";

/// A failure to render: a template error or, a bug in a template, output
/// that does not parse as Rust.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// A template failed to render (a bug in rfidl-codegen).
    #[error("template {template} failed to render: {source}")]
    Render {
        /// The template's file name in `templates/`: `service.rs.askama`.
        template: &'static str,
        /// askama's error.
        source: askama::Error,
    },
    /// Rendered code that does not parse as Rust. From the templates alone
    /// this is a bug; it is also how a derive or attribute given to
    /// `Builder::type_derive` / `type_attribute` that is not valid Rust
    /// shows.
    #[error(
        "generated code for {what} is not valid Rust ({source}); this is a bug in rfidl-codegen's templates"
    )]
    InvalidRust {
        /// Which output: a package name, or `the module tree`.
        what: String,
        /// syn's parse error (its message names the problem).
        source: syn::Error,
        /// The code that did not parse, for a bug report.
        text: String,
    },
}

/// Renders one package module and formats it like hand-written code. Each
/// item (record, enum, service module) is rendered and formatted on its own:
/// prettyplease prints a file's items one after the other, so the result is
/// the same as formatting the whole module at once, without holding the
/// syntax tree of the whole module in memory.
///
/// Takes the generator's internal view of a package; public for tests only.
#[doc(hidden)]
pub fn render_package(
    package: &str,
    view: &templates::PackageTemplate,
) -> Result<String, GenerateError> {
    let mut text = String::new();
    for unit in package_units(package, view) {
        text.push_str(&unit.run()?.text);
    }
    Ok(with_header(&text))
}

/// Parses `text` as a Rust file and prints it with prettyplease, with the
/// `@generated` header on top.
pub fn format_rust(what: &str, text: &str) -> Result<String, GenerateError> {
    let pretty = format_items(what, text)?;
    Ok(with_header(&pretty))
}

/// Parses `text` as Rust items and prints them with prettyplease, as they
/// are (no header, no blank lines added between items).
fn format_items(what: &str, text: &str) -> Result<String, GenerateError> {
    let file = syn::parse_file(text).map_err(|source| GenerateError::InvalidRust {
        what: what.to_owned(),
        source,
        text: text.to_owned(),
    })?;
    Ok(prettyplease::unparse(&file))
}

/// The `@generated` header, a blank line, then `text` with blank lines
/// between items (see [`space_items_into`]), written once into one string.
fn with_header(text: &str) -> String {
    let mut out = String::with_capacity(GENERATED_HEADER.len() + 2 + text.len() + text.len() / 16);
    out.push_str(GENERATED_HEADER);
    out.push_str("\n\n");
    space_items_into(&mut out, text);
    out
}

/// prettyplease prints items back to back; hand-written Rust puts a blank
/// line between items. Adds one after an item's closing line (`}`, `};`, or a
/// `;`-terminated item other than `use`) when the next line starts another
/// item at the same indentation. Appends to `out`.
fn space_items_into(out: &mut String, text: &str) {
    const ITEM_STARTS: &[&str] = &[
        "///", "#[", "pub ", "impl", "fn ", "const ", "struct ", "enum ", "mod ", "trait ", "use ",
    ];
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        out.push('\n');
        let Some(next) = lines.peek() else {
            continue;
        };
        let (this, following) = (line.trim(), next.trim());
        // A comment line ending in `;` (a doc sentence) closes nothing.
        let closes_item =
            !this.starts_with("//") && (this == "}" || this == "};" || this.ends_with(';'));
        if !closes_item {
            continue;
        }
        let both_uses = this.starts_with("use ") && following.starts_with("use ");
        let starts_item = ITEM_STARTS.iter().any(|start| following.starts_with(start));
        if starts_item && !both_uses && indent(line) == indent(next) {
            out.push('\n');
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::manifest::{
        Delivery, Field, Manifest, Method, MethodKind, TypeDef, TypeRef, Variant,
    };

    fn field(name: &str, ty: &str) -> Field {
        Field {
            name: name.into(),
            ty: ty.parse().expect(ty),
            docs: vec![],
            deprecated: None,
        }
    }

    /// A small but complete package: records (one recursive, one using a
    /// keyword field), an enum, and a service with all three method kinds.
    pub(crate) fn sample() -> Vec<PackageContract> {
        let employee = TypeDef::Record {
            docs: vec!["A person employed by the company.".into()],
            deprecated: None,
            fields: vec![
                Field {
                    docs: vec!["Stable identifier issued by HR.".into()],
                    ..field("id", "uuid")
                },
                field("name", "string"),
                field("email", "string?"),
                field("type", "hr.Status"),
                field("manager", "hr.Employee?"),
                field("reports", "list<hr.Employee>"),
                field("salary", "common.Money"),
            ],
        };
        let status = TypeDef::Enum {
            docs: vec![],
            deprecated: Some("use the v2 status".into()),
            variants: vec![Variant {
                name: "Active".into(),
                docs: vec![],
                deprecated: None,
            }],
        };
        let ack = TypeDef::Record {
            docs: vec![],
            deprecated: None,
            fields: vec![field("workflow_id", "uuid")],
        };
        let money = TypeDef::Record {
            docs: vec![],
            deprecated: None,
            fields: vec![field("amount", "decimal"), field("currency", "string")],
        };
        let types: std::collections::BTreeMap<String, TypeDef> = [
            ("hr.Employee".to_owned(), employee.clone()),
            ("hr.Status".to_owned(), status.clone()),
            ("hr.HireAck".to_owned(), ack.clone()),
            ("common.Money".to_owned(), money.clone()),
        ]
        .into();
        let manifest = Manifest {
            format: crate::manifest::FORMAT_VERSION,
            interface: "hr.EmpService".into(),
            package: "hr".into(),
            service: "EmpService".into(),
            version: 1,
            fingerprint: String::new(),
            docs: vec!["Employee lifecycle.".into()],
            deprecated: None,
            methods: vec![
                Method {
                    name: "EmployeeHired".into(),
                    kind: MethodKind::Pushcall,
                    docs: vec!["Raised when an employee is hired.".into()],
                    deprecated: None,
                    params: vec![field("employee", "hr.Employee")],
                    response: Some("hr.HireAck".parse().expect("type")),
                    correlate: Some(vec!["employee".into(), "id".into()]),
                    delivery: Some(Delivery {
                        max_retries: Some(10),
                        ttl_ms: Some(48 * 3_600_000),
                    }),
                },
                Method {
                    name: "OnboardingCompleted".into(),
                    kind: MethodKind::Signal,
                    docs: vec![],
                    deprecated: None,
                    params: vec![
                        field("employee_id", "uuid"),
                        field("completed_at", "timestamp"),
                    ],
                    response: None,
                    correlate: None,
                    delivery: None,
                },
                Method {
                    name: "ProvisionLaptop".into(),
                    kind: MethodKind::Command,
                    docs: vec![],
                    deprecated: None,
                    params: vec![field("employee", "hr.Employee"), field("model", "string")],
                    response: Some(TypeRef::Scalar(crate::manifest::Scalar::String)),
                    correlate: Some(vec!["employee".into(), "manager".into(), "id".into()]),
                    delivery: None,
                },
            ],
            types,
        }
        .with_fingerprint();
        vec![
            PackageContract {
                package: "common".into(),
                docs: vec![],
                types: vec![("common.Money".into(), money)],
                services: vec![],
            },
            PackageContract {
                package: "hr".into(),
                docs: vec![],
                types: vec![
                    ("hr.Employee".into(), employee),
                    ("hr.Status".into(), status),
                    ("hr.HireAck".into(), ack),
                ],
                services: vec![manifest],
            },
        ]
    }

    #[test]
    fn formatting_items_one_by_one_equals_formatting_the_whole_module() {
        for contract in sample() {
            let view = plan::plan_package(&contract, &Options::default());
            let text = view.render().expect("renders");
            let whole = format_rust(&contract.package, &text).expect("formats");
            let by_item = render_package(&contract.package, &view).expect("formats");
            assert_eq!(by_item, whole, "package {}", contract.package);
        }
    }

    /// Derives and attributes from the builder are text the checker never
    /// saw: their items go through syn (which refuses bad Rust) and
    /// prettyplease, everything else keeps the fast layout.
    #[test]
    fn items_with_builder_derives_or_attributes_take_the_syn_path() {
        let rule = |path: &str, kind| options::TypeRule {
            path: path.into(),
            kind,
        };
        let options = Options {
            type_rules: vec![
                rule("hr.Employee", options::TypeRuleKind::Derive("Eq".into())),
                rule(
                    "hr.Status",
                    options::TypeRuleKind::Attribute("#[non_exhaustive]".into()),
                ),
            ],
            ..Options::default()
        };
        let (files, stats) =
            generate_files_with_stats(&sample(), &options, Layout::SourceDir).expect("generate");
        let (_, plain) =
            generate_files_with_stats(&sample(), &Options::default(), Layout::SourceDir)
                .expect("generate");
        // common: prelude + Money; hr: prelude + 3 records/enums + 1 service.
        assert_eq!(stats.items, 2 + 5);
        assert_eq!(
            stats.fallbacks,
            plain.fallbacks + 2,
            "Employee and Status, besides any item too wide for the fast layout"
        );
        let hr = &files[1].contents;
        assert!(hr.contains("#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Eq)]"));
        assert!(hr.contains("#[non_exhaustive]\npub enum Status {"));

        let broken = Options {
            type_rules: vec![rule(
                ".",
                options::TypeRuleKind::Attribute("#[oops(".into()),
            )],
            ..Options::default()
        };
        let error = generate_files(&sample(), &broken, Layout::SourceDir)
            .expect_err("an attribute that is not Rust");
        assert!(
            matches!(error, GenerateError::InvalidRust { .. }),
            "{error}"
        );
    }

    #[test]
    fn parallel_map_keeps_the_order_of_its_items() {
        let items: Vec<u32> = (0..1000).collect();
        let doubled = parallel_map(2, &items, |item| {
            // Uneven work, so threads finish out of order.
            if item % 7 == 0 {
                std::thread::yield_now();
            }
            item * 2
        });
        assert_eq!(
            doubled,
            items.iter().map(|item| item * 2).collect::<Vec<_>>()
        );
    }

    #[test]
    fn renders_parseable_rust_for_every_artefact() {
        let files =
            generate_files(&sample(), &Options::default(), Layout::SourceDir).expect("generate");
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "common.rs",
                "hr.rs",
                "manifests/hr.EmpService.v1.json",
                "manifests/hr.EmpService.v1.yaml",
                "mod.rs"
            ]
        );
        let hr = &files[1].contents;
        if std::env::var_os("RFIDL_SHOW").is_some() {
            println!("{hr}\n{}", files[4].contents);
        }
        assert!(hr.starts_with(GENERATED_HEADER));
        assert!(
            hr.contains("pub r#type: Status,"),
            "keyword field is a raw identifier"
        );
        assert!(
            hr.contains("pub manager: Option<Box<Employee>>,"),
            "recursion boxed"
        );
        assert!(
            hr.contains("pub reports: Vec<Employee>,"),
            "lists need no box"
        );
        assert!(hr.contains("pub salary: super::common::Money,"));
        assert!(hr.contains("pub mod emp_service_v1 {"));
        assert!(hr.contains("correlation_id: Some(request.employee.id.to_string()),"));
        let flat: String = hr.split_whitespace().collect();
        assert!(flat.contains(
            "correlation_id:request.employee.manager.as_ref().map(|v|&v.id).map(::std::string::ToString::to_string),"
        ));
    }
}
