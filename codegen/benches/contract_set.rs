//! The benchmark's generated contract set, as text: shared by
//! `benches/check.rs` (100 services x 20 methods, 500 records) and by
//! `tests/it/fast_layout.rs` (a small size), so the test covers the
//! benchmark's code shapes.

use std::fmt::Write as _;

/// The size of a generated set.
#[derive(Debug, Clone, Copy)]
pub struct SetSize {
    pub packages: usize,
    pub services_per_package: usize,
    pub methods_per_service: usize,
    pub records_per_package: usize,
}

/// The files of the set: `shared.rfidl` first, then `p0.rfidl`, … (each
/// package imports the shared one), as (file name, text).
pub fn contract_texts(size: SetSize) -> Vec<(String, String)> {
    let mut shared = String::from(
        "package bench.shared;\n\nrecord Money {\n    amount: decimal,\n    currency: string,\n}\n",
    );
    shared.push_str("\nenum Level {\n    Low,\n    High,\n}\n");
    let mut files = vec![("shared.rfidl".to_owned(), shared)];
    for p in 0..size.packages {
        let mut text =
            format!("/// Package {p}.\npackage bench.p{p};\n\nimport \"shared.rfidl\";\n");
        for r in 0..size.records_per_package {
            let _ = write!(
                text,
                "\n/// Record {r}.\nrecord Rec{r} {{\n    id: uuid,\n    name: string,\n    amount: shared.Money,\n    \
                 level: shared.Level,\n    tags: list<string>,\n    extra: map<string, i64>,\n    note: string?,\n{}}}\n",
                if r > 0 {
                    format!("    previous: Rec{}?,\n", r - 1)
                } else {
                    String::new()
                }
            );
        }
        for s in 0..size.services_per_package {
            let _ = write!(text, "\n/// Service {s}.\nservice Svc{s} v1 {{\n");
            for m in 0..size.methods_per_service {
                let record = (s * size.methods_per_service + m) % size.records_per_package;
                let (kind, response) = match m % 3 {
                    0 => ("signal", String::new()),
                    1 => ("pushcall", format!(" -> Rec{record}")),
                    _ => ("command", " -> shared.Money".to_owned()),
                };
                let _ = write!(
                    text,
                    "    /// Method {m}.\n    @correlate(item.id)\n    @delivery(max_retries = 3, ttl = \"1h\")\n    \
                     {kind} Method{m}(item: Rec{record}, at: timestamp, count: u32){response};\n\n"
                );
            }
            text.push_str("}\n");
        }
        files.push((format!("p{p}.rfidl"), text));
    }
    files
}
