//! Diagnostics: stable error codes, spans into loaded sources, and rendering
//! as rustc-style text (codespan-reporting) or JSON lines.
//!
//! Every contract error the toolchain can report has an [`ErrorCode`]; the
//! codes are documented in `docs/errors.md` and never reused for another
//! meaning.

use std::fmt;
use std::path::{Path, PathBuf};

use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label, Severity as CsSeverity};
use codespan_reporting::files::{Files, SimpleFiles};
use codespan_reporting::term::{self, Chars};
use serde::Serialize;

/// Index of a loaded source in a [`SourceMap`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub(crate) usize);

/// A byte range in one source file.
///
/// Offsets are bytes into the file's text as held by the [`SourceMap`]
/// (`&sources.text(span.file)[span.start..span.end]`), on `char`
/// boundaries; renderers turn them into 1-based lines and character
/// columns ([`SourceMap::line_column`]). Spans order by file, then start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    /// The file the range is in.
    pub file: FileId,
    /// First byte of the range (inclusive).
    pub start: usize,
    /// End of the range (exclusive); equal to `start` for an empty span,
    /// which points between two characters (where something is missing).
    pub end: usize,
}

impl Span {
    /// The bytes `start..end` of `file`.
    pub fn new(file: FileId, start: usize, end: usize) -> Self {
        Self { file, start, end }
    }
}

/// The sources of one run, with the names diagnostics show for them.
#[derive(Default)]
pub struct SourceMap {
    files: SimpleFiles<String, String>,
    paths: Vec<PathBuf>,
}

impl fmt::Debug for SourceMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceMap")
            .field("paths", &self.paths)
            .finish()
    }
}

impl SourceMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a source; `name` is what diagnostics print (usually the path as
    /// given), `path` is where it was read from (the loader stores the
    /// canonical path, which [`find`](Self::find) compares against).
    /// Returns the new file's id; ids are handed out in order from 0.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        path: impl Into<PathBuf>,
        text: impl Into<String>,
    ) -> FileId {
        self.paths.push(path.into());
        FileId(self.files.add(name.into(), text.into()))
    }

    /// The full text of `file`; empty for an id this map did not hand out.
    pub fn text(&self, file: FileId) -> &str {
        self.files
            .get(file.0)
            .map(|f| f.source().as_str())
            .unwrap_or("")
    }

    /// The name diagnostics print for `file` (see [`add`](Self::add));
    /// `<unknown>` for an id this map did not hand out.
    pub fn name(&self, file: FileId) -> &str {
        self.files
            .get(file.0)
            .map(|f| f.name().as_str())
            .unwrap_or("<unknown>")
    }

    /// The path `file` was read from.
    ///
    /// # Panics
    ///
    /// If `file` was not handed out by this map.
    pub fn path(&self, file: FileId) -> &Path {
        &self.paths[file.0]
    }

    /// Every loaded file, in load order.
    pub fn ids(&self) -> impl Iterator<Item = FileId> + '_ {
        (0..self.paths.len()).map(FileId)
    }

    /// The file loaded from `path`, if any.
    pub fn find(&self, path: &Path) -> Option<FileId> {
        self.paths.iter().position(|p| p == path).map(FileId)
    }

    /// 1-based line and column (in characters, not bytes) of a byte offset:
    /// the positions editors and the JSON output show. `(1, 1)` when the
    /// file is unknown or the offset lies outside it.
    pub fn line_column(&self, file: FileId, byte: usize) -> (usize, usize) {
        match self.files.location(file.0, byte) {
            Ok(location) => (location.line_number, location.column_number),
            Err(_) => (1, 1),
        }
    }
}

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// An `E…` code: the contract is wrong. `rfidl check` exits 1 and no
    /// model (so no code, no manifest) is produced.
    Error,
    /// A `W…` code: shown, but checking and generation go on.
    Warning,
}

macro_rules! error_codes {
    ($($variant:ident = $code:literal, $title:literal;)*) => {
        /// Every stable diagnostic code. See `docs/errors.md`.
        ///
        /// `E…` codes are errors, `W…` codes warnings. A code keeps its
        /// meaning forever; new ones may be added (the enum is
        /// `#[non_exhaustive]`). Each variant's doc is its code and
        /// [`title`](Self::title).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum ErrorCode { $(#[doc = concat!("`", $code, "`: ", $title, ".")] $variant,)* }

        impl ErrorCode {
            /// All codes, in numeric order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// `E0001`-style code.
            pub fn code(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// One line saying what the code means.
            pub fn title(self) -> &'static str {
                match self { $(ErrorCode::$variant => $title,)* }
            }
        }
    };
}

error_codes! {
    Syntax = "E0001", "syntax error";
    InvalidUtf8 = "E0002", "source is not valid UTF-8";
    NestingTooDeep = "E0003", "type nesting too deep";
    InvalidString = "E0004", "invalid string literal";
    MissingPackage = "E0005", "missing or misplaced package declaration";
    DuplicatePackage = "E0006", "more than one package declaration";
    UnknownType = "E0010", "unknown type";
    UnknownPackage = "E0011", "unknown package or name not in that package";
    AmbiguousPackage = "E0012", "package qualifier matches more than one import";
    NotImported = "E0013", "type declared in a file that is not imported";
    GeneratedNameCollision = "E0014", "names collide in generated code";
    ReservedGeneratedName = "E0015", "name is taken by generated code";
    DuplicateType = "E0020", "duplicate type name";
    DuplicateField = "E0021", "duplicate field";
    DuplicateVariant = "E0022", "duplicate enum variant";
    DuplicateMethod = "E0023", "duplicate method";
    DuplicateParam = "E0024", "duplicate parameter";
    DuplicateServiceVersion = "E0025", "duplicate service version";
    MethodRustNameClash = "E0026", "two methods map to the same Rust name";
    RequiredCycle = "E0030", "record contains itself through required fields";
    MapKeyNotString = "E0040", "map key is not `string`";
    SignalWithResponse = "E0041", "signal declares a response";
    InvalidVersion = "E0042", "service version out of range (1 up to 4294967295)";
    EmptyEnum = "E0043", "enum has no variants";
    NotUpperCamelCase = "E0050", "name should be UpperCamelCase";
    NotSnakeCase = "E0051", "name should be snake_case";
    InvalidPackageName = "E0052", "package name should be lowercase dotted segments";
    ImportNotFound = "E0060", "imported file not found";
    ImportCycle = "E0061", "import cycle";
    UnknownAnnotation = "E0070", "unknown annotation";
    AnnotationTarget = "E0071", "annotation not allowed here";
    AnnotationArguments = "E0072", "invalid annotation arguments";
    CorrelatePath = "E0073", "`@correlate` path does not resolve to a scalar";
    DuplicateAnnotation = "E0074", "duplicate annotation";
    DanglingDocComment = "W0001", "doc comment documents nothing";
    DeprecatedUse = "W0002", "use of a deprecated type";
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// One finding, with where it is and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The stable code (`E0010`, `W0002`, …), documented in `docs/errors.md`.
    pub code: ErrorCode,
    /// Whether it stops the check ([`Severity::Error`]) or is only shown.
    pub severity: Severity,
    /// The headline, one line without a final period: ``unknown type `Employe` ``.
    pub message: String,
    /// The primary location; `None` for file-less problems.
    pub span: Option<Span>,
    /// Text under the primary caret.
    pub label: String,
    /// Other places the finding involves (the first declaration of a
    /// duplicate, the import that is missing, …), each with the text shown
    /// under it.
    pub secondary: Vec<(Span, String)>,
    /// How to fix it, shown as `= help: …` (a "did you mean", the line to
    /// write).
    pub help: Option<String>,
    /// Further explanation, each shown as `= note: …`.
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// An error with `code` at `span`; add a label, places, help and notes
    /// with the `with_…` methods.
    pub fn error(code: ErrorCode, span: Span, message: impl Into<String>) -> Self {
        Self {
            code,
            severity: Severity::Error,
            message: message.into(),
            span: Some(span),
            label: String::new(),
            secondary: Vec::new(),
            help: None,
            notes: Vec::new(),
        }
    }

    /// A finding that does not stop checking or generation.
    pub fn warning(code: ErrorCode, span: Span, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(code, span, message)
        }
    }

    /// Sets the text under the primary caret.
    #[must_use]
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Adds another place, with the text shown under it.
    #[must_use]
    pub fn with_secondary(mut self, span: Span, label: impl Into<String>) -> Self {
        self.secondary.push((span, label.into()));
        self
    }

    /// Sets the help line (replacing any earlier one).
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds a note.
    #[must_use]
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    /// Whether its severity is [`Severity::Error`].
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Whether rustc-style diagnostics are coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorChoice {
    /// Colour when stderr is a terminal and `NO_COLOR` is not set.
    #[default]
    Auto,
    /// Always colour (ANSI escapes), even into a pipe.
    Always,
    /// Never colour: the plain text of [`render_human`].
    Never,
}

impl ColorChoice {
    /// Whether output to stderr gets colour.
    pub fn colors_stderr(self) -> bool {
        use std::io::IsTerminal as _;
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
            }
        }
    }
}

/// Writes diagnostics rustc-style to stderr, coloured if `color` says so;
/// the text is the same as [`render_human`]'s.
pub fn emit_human_to_stderr(
    sources: &SourceMap,
    diagnostics: &[Diagnostic],
    color: ColorChoice,
) -> std::io::Result<()> {
    use std::io::Write as _;
    if !color.colors_stderr() {
        let mut stderr = std::io::stderr().lock();
        for diagnostic in diagnostics {
            stderr.write_all(render_human(sources, diagnostic).as_bytes())?;
        }
        return Ok(());
    }
    use term::termcolor::{ColorChoice as Colors, StandardStream};
    let stream = StandardStream::stderr(Colors::Always);
    let mut stderr = stream.lock();
    for diagnostic in diagnostics {
        term::emit_to_write_style(
            &mut stderr,
            &human_config(),
            &sources.files,
            &to_codespan(diagnostic),
        )
        .map_err(std::io::Error::other)?;
    }
    Ok(())
}

fn human_config() -> term::Config {
    term::Config {
        chars: Chars::ascii(),
        ..term::Config::default()
    }
}

/// Renders diagnostics like rustc: `error[E0010]: …`, ` --> file:line:col`,
/// the source line, a caret under the span, then `= help: …`.
pub fn render_human(sources: &SourceMap, diagnostic: &Diagnostic) -> String {
    term::emit_into_string(&human_config(), &sources.files, &to_codespan(diagnostic))
        .unwrap_or_else(|_| format!("error[{}]: {}\n", diagnostic.code, diagnostic.message))
}

fn to_codespan(diagnostic: &Diagnostic) -> CsDiagnostic<usize> {
    let severity = match diagnostic.severity {
        Severity::Error => CsSeverity::Error,
        Severity::Warning => CsSeverity::Warning,
    };
    let mut labels = Vec::new();
    if let Some(span) = diagnostic.span {
        labels.push(
            Label::primary(span.file.0, span.start..span.end).with_message(&diagnostic.label),
        );
    }
    for (span, text) in &diagnostic.secondary {
        labels.push(Label::secondary(span.file.0, span.start..span.end).with_message(text));
    }
    let mut notes: Vec<String> = diagnostic
        .help
        .iter()
        .map(|h| format!("help: {h}"))
        .collect();
    notes.extend(diagnostic.notes.iter().map(|n| format!("note: {n}")));
    CsDiagnostic::new(severity)
        .with_code(diagnostic.code.code())
        .with_message(&diagnostic.message)
        .with_labels(labels)
        .with_notes(notes)
}

/// One diagnostic as a JSON object (one line), for editors and CI: `code`,
/// `severity`, `message`, `file`, `line`, `column`, `end_line`, `end_column`
/// (1-based; columns count characters), `label`, `help`, `notes` and
/// `related` (the secondary places, each with file, lines, columns, label).
pub fn render_json(sources: &SourceMap, diagnostic: &Diagnostic) -> String {
    #[derive(Serialize)]
    struct Json<'a> {
        code: &'static str,
        severity: Severity,
        message: &'a str,
        file: Option<&'a str>,
        line: Option<usize>,
        column: Option<usize>,
        end_line: Option<usize>,
        end_column: Option<usize>,
        label: &'a str,
        help: Option<&'a str>,
        notes: &'a [String],
        /// The other places the diagnostic points at.
        related: Vec<Related<'a>>,
    }
    #[derive(Serialize)]
    struct Related<'a> {
        file: &'a str,
        line: usize,
        column: usize,
        end_line: usize,
        end_column: usize,
        label: &'a str,
    }
    let (start, end) = match diagnostic.span {
        Some(span) => (
            Some(sources.line_column(span.file, span.start)),
            Some(sources.line_column(span.file, span.end)),
        ),
        None => (None, None),
    };
    let json = Json {
        code: diagnostic.code.code(),
        severity: diagnostic.severity,
        message: &diagnostic.message,
        file: diagnostic.span.map(|s| sources.name(s.file)),
        line: start.map(|p| p.0),
        column: start.map(|p| p.1),
        end_line: end.map(|p| p.0),
        end_column: end.map(|p| p.1),
        label: &diagnostic.label,
        help: diagnostic.help.as_deref(),
        notes: &diagnostic.notes,
        related: diagnostic
            .secondary
            .iter()
            .map(|(span, label)| {
                let (line, column) = sources.line_column(span.file, span.start);
                let (end_line, end_column) = sources.line_column(span.file, span.end);
                Related {
                    file: sources.name(span.file),
                    line,
                    column,
                    end_line,
                    end_column,
                    label,
                }
            })
            .collect(),
    };
    serde_json::to_string(&json).expect("diagnostics always serialise")
}

/// One diagnostic as a GitHub Actions workflow command (one line), which
/// GitHub shows as an annotation on the file and line:
/// `::error file=shop.rfidl,line=5,col=11,endLine=5,endColumn=16,title=E0010::unknown type…`
/// (`::warning` for warnings). The help, if any, follows the message on its
/// own line of the annotation.
pub fn render_github(sources: &SourceMap, diagnostic: &Diagnostic) -> String {
    let mut message = diagnostic.message.clone();
    if let Some(help) = &diagnostic.help {
        message.push_str("\nhelp: ");
        message.push_str(help);
    }
    let mut properties = Vec::new();
    if let Some(span) = diagnostic.span {
        let (line, column) = sources.line_column(span.file, span.start);
        let (end_line, end_column) = sources.line_column(span.file, span.end);
        properties.push(format!("file={}", github_property(sources.name(span.file))));
        properties.push(format!("line={line}"));
        properties.push(format!("col={column}"));
        properties.push(format!("endLine={end_line}"));
        properties.push(format!("endColumn={end_column}"));
    }
    properties.push(format!("title={}", diagnostic.code.code()));
    let command = match diagnostic.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    github_command(command, &properties, &message)
}

/// `::{command} {properties}::{message}`, the message escaped as GitHub's
/// workflow commands want (`%`, CR and LF).
pub fn github_command(command: &str, properties: &[String], message: &str) -> String {
    let message = message
        .replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A");
    if properties.is_empty() {
        format!("::{command}::{message}")
    } else {
        format!("::{command} {}::{message}", properties.join(","))
    }
}

/// A workflow command's property value, escaped (`%`, CR, LF, `:` and `,`).
pub fn github_property(value: &str) -> String {
    value
        .replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
        .replace(':', "%3A")
        .replace(',', "%2C")
}

/// The closest candidate to `name` by edit distance, if close enough to be a
/// plausible typo ("did you mean").
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| *c != name)
        .map(|c| {
            (
                strsim::damerau_levenshtein(&name.to_lowercase(), &c.to_lowercase()),
                c,
            )
        })
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, c)| (*distance, *c))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_commands_escape_their_message_and_properties() {
        let mut sources = SourceMap::new();
        let file = sources.add(
            "a:b,c.rfidl",
            "a:b,c.rfidl",
            "package x;\nrecord R { a: Nope }\n",
        );
        let start = sources.text(file).find("Nope").expect("present");
        let diagnostic = Diagnostic::error(
            ErrorCode::UnknownType,
            Span::new(file, start, start + 4),
            "100% wrong:\r\nreally",
        )
        .with_help("spell it");
        assert_eq!(
            render_github(&sources, &diagnostic),
            "::error file=a%3Ab%2Cc.rfidl,line=2,col=15,endLine=2,endColumn=19,title=E0010::\
             100%25 wrong:%0D%0Areally%0Ahelp: spell it"
        );
        assert_eq!(github_command("notice", &[], "a::b"), "::notice::a::b");
    }

    #[test]
    fn suggestions_are_close_and_deterministic() {
        let types = ["Employee", "EmploymentStatus", "HireAck"];
        assert_eq!(suggest("Employe", types), Some("Employee"));
        assert_eq!(suggest("employee", types), Some("Employee"), "case-blind");
        assert_eq!(suggest("Ack", types), None, "too far");
        assert_eq!(suggest("Employee", types), None, "never the name itself");
        // Ties go to the alphabetically first candidate.
        assert_eq!(suggest("ab", ["ac", "aa"]), Some("aa"));
    }

    #[test]
    fn json_lines_carry_positions_in_characters() {
        let mut sources = SourceMap::new();
        let file = sources.add("x.rfidl", "x.rfidl", "package ä;\nrecord Ö { a: Nope }\n");
        let start = sources.text(file).find("Nope").expect("present");
        let diagnostic = Diagnostic::error(
            ErrorCode::UnknownType,
            Span::new(file, start, start + 4),
            "unknown type `Nope`",
        )
        .with_secondary(Span::new(file, 8, 10), "package");
        let json: serde_json::Value =
            serde_json::from_str(&render_json(&sources, &diagnostic)).expect("valid JSON");
        assert_eq!(json["code"], "E0010");
        assert_eq!(json["file"], "x.rfidl");
        assert_eq!(
            (json["line"].as_u64(), json["column"].as_u64()),
            (Some(2), Some(15))
        );
        assert_eq!(json["end_column"], 19);
        assert_eq!(json["related"][0]["column"], 9);
        assert_eq!(json["related"][0]["end_column"], 10, "`ä` is one character");
    }
}
