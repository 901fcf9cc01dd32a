//! Front-end and generator benchmarks (see BENCHMARKS.md):
//! `cargo bench -p rfidl-codegen --bench check`.
//!
//! Builds a contract set of 100 services x 20 methods and 500 records in 10
//! files of 10 packages (importing a shared one), then measures, each as the
//! median of several runs: load + parse + check; `rfidl fmt`'s formatting;
//! code generation from the checked model; and a build script's re-run on
//! unchanged contracts.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rfidl_codegen::check::check_paths;
use rfidl_codegen::generate::{Layout, generate_files};

const PACKAGES: usize = 10;
const SERVICES_PER_PACKAGE: usize = 10;
const METHODS_PER_SERVICE: usize = 20;
const RECORDS_PER_PACKAGE: usize = 50;
const RUNS: usize = 15;

fn contract_set(dir: &std::path::Path) -> (Vec<std::path::PathBuf>, usize) {
    let mut shared = String::from(
        "package bench.shared;\n\nrecord Money {\n    amount: decimal,\n    currency: string,\n}\n",
    );
    shared.push_str("\nenum Level {\n    Low,\n    High,\n}\n");
    std::fs::write(dir.join("shared.rfidl"), &shared).expect("write");
    let mut lines = shared.lines().count();
    let mut roots = Vec::new();
    for p in 0..PACKAGES {
        let mut text =
            format!("/// Package {p}.\npackage bench.p{p};\n\nimport \"shared.rfidl\";\n");
        for r in 0..RECORDS_PER_PACKAGE {
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
        for s in 0..SERVICES_PER_PACKAGE {
            let _ = write!(text, "\n/// Service {s}.\nservice Svc{s} v1 {{\n");
            for m in 0..METHODS_PER_SERVICE {
                let record = (s * METHODS_PER_SERVICE + m) % RECORDS_PER_PACKAGE;
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
        lines += text.lines().count();
        let path = dir.join(format!("p{p}.rfidl"));
        std::fs::write(&path, text).expect("write");
        roots.push(path);
    }
    (roots, lines)
}

fn median(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[0])
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (roots, lines) = contract_set(dir.path());
    println!(
        "contract set: {} services x {METHODS_PER_SERVICE} methods, {} records, {} files, {lines} lines",
        PACKAGES * SERVICES_PER_PACKAGE,
        PACKAGES * RECORDS_PER_PACKAGE,
        roots.len() + 1
    );

    let mut check_times = Vec::new();
    let mut model = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let outcome = check_paths(&roots).expect("readable");
        check_times.push(started.elapsed());
        assert!(!outcome.has_errors(), "{}", outcome.render_human());
        model = outcome.model;
    }
    let model = model.expect("checked");
    let (check_median, check_min) = median(check_times);
    println!(
        "{:<44} median {:>8.1} ms   min {:>8.1} ms   {:>10.0} lines/s",
        "load + parse + check",
        check_median.as_secs_f64() * 1e3,
        check_min.as_secs_f64() * 1e3,
        lines as f64 / check_median.as_secs_f64()
    );

    // `rfidl fmt` over the same files (text already in memory).
    let texts: Vec<String> = roots
        .iter()
        .map(|root| std::fs::read_to_string(root).expect("read"))
        .collect();
    let mut format_times = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        for text in &texts {
            rfidl_codegen::format::format_source(text).expect("formats");
        }
        format_times.push(started.elapsed());
    }
    let (format_median, format_min) = median(format_times);
    println!(
        "{:<44} median {:>8.1} ms   min {:>8.1} ms   {:>10.0} lines/s",
        "fmt (format_source, every file)",
        format_median.as_secs_f64() * 1e3,
        format_min.as_secs_f64() * 1e3,
        lines as f64 / format_median.as_secs_f64()
    );

    let options = rfidl_codegen::Options::default();
    let mut generate_times = Vec::new();
    let mut bytes = 0;
    for _ in 0..RUNS {
        let started = Instant::now();
        let files = generate_files(&model.packages, &options, Layout::OutDir).expect("generate");
        generate_times.push(started.elapsed());
        bytes = files.iter().map(|f| f.contents.len()).sum::<usize>();
    }
    let (generate_median, generate_min) = median(generate_times);
    println!(
        "{:<44} median {:>8.1} ms   min {:>8.1} ms   {:>10.1} MB of output",
        "generate (templates + syn + prettyplease)",
        generate_median.as_secs_f64() * 1e3,
        generate_min.as_secs_f64() * 1e3,
        bytes as f64 / 1e6
    );

    let out = dir.path().join("out");
    let builder = rfidl_codegen::Builder::new()
        .out_dir(&out)
        .skip_rerun_if_changed();
    builder.compile(&roots).expect("first build");
    let mut rebuild_times = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        builder.compile(&roots).expect("rebuild");
        rebuild_times.push(started.elapsed());
    }
    let (rebuild_median, rebuild_min) = median(rebuild_times);
    println!(
        "{:<44} median {:>8.1} ms   min {:>8.1} ms   (writes nothing)",
        "build.rs re-run, contracts unchanged",
        rebuild_median.as_secs_f64() * 1e3,
        rebuild_min.as_secs_f64() * 1e3
    );
}
