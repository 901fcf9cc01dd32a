//! Loading: reads the root files and, transitively, what they import
//! (paths relative to the importing file), parses each once.
//!
//! Owns import errors (missing file, cycle) and input errors (not UTF-8,
//! syntax). Never applies language rules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::diagnostics::{Diagnostic, ErrorCode, FileId, SourceMap, Span};
use crate::syntax::{self, ast};

/// A root path that could not be read at all: an I/O problem, not a contract error.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {source}")]
pub struct LoadError {
    /// The path that failed, as given (a root, or the directory being listed).
    pub path: PathBuf,
    /// Why: the I/O error (`NotFound` also for a directory holding no
    /// `.rfidl` file).
    pub source: std::io::Error,
}

/// Everything loaded for one run.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every file read, roots and imports, in load order; the [`FileId`]s
    /// below index into it.
    pub sources: SourceMap,
    /// Parsed files, by file id; files that failed to parse are absent.
    pub files: BTreeMap<FileId, ast::File>,
    /// Direct imports of each file that loaded (cycle edges excluded).
    pub imports: BTreeMap<FileId, Vec<FileId>>,
    /// Problems found while loading: files that are not UTF-8 (E0002),
    /// syntax errors, missing imports (E0060) and import cycles (E0061).
    /// No language rule is checked here.
    pub diagnostics: Vec<Diagnostic>,
    /// Every file read, for `cargo:rerun-if-changed`.
    pub read_paths: Vec<PathBuf>,
    /// Folders searched for an import not found beside the importing file.
    pub include_paths: Vec<PathBuf>,
}

/// Every `.rfidl` file under `dir`, recursively, sorted.
pub fn contract_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| LoadError {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| LoadError {
                    path: dir.clone(),
                    source,
                })?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rfidl") {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Loads `roots` (files, or directories meaning every `.rfidl` below them).
pub fn load(roots: &[PathBuf]) -> Result<Loaded, LoadError> {
    load_with_includes(roots, &[])
}

/// Like [`load`]; an import not found beside the importing file is looked
/// for in each of `include_paths`, in order.
pub fn load_with_includes(
    roots: &[PathBuf],
    include_paths: &[PathBuf],
) -> Result<Loaded, LoadError> {
    let mut loaded = Loaded {
        include_paths: include_paths.to_vec(),
        ..Loaded::default()
    };
    let mut files = Vec::new();
    for root in roots {
        if root.is_dir() {
            let found = contract_files(root)?;
            if found.is_empty() {
                return Err(LoadError {
                    path: root.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no .rfidl files in this directory",
                    ),
                });
            }
            files.extend(found);
        } else {
            files.push(root.clone());
        }
    }
    for file in files {
        let canonical = std::fs::canonicalize(&file).map_err(|source| LoadError {
            path: file.clone(),
            source,
        })?;
        if loaded.sources.find(&canonical).is_some() {
            continue;
        }
        let bytes = std::fs::read(&file).map_err(|source| LoadError {
            path: file.clone(),
            source,
        })?;
        let mut stack = Vec::new();
        load_file(
            &mut loaded,
            display_name(&file),
            canonical,
            bytes,
            &mut stack,
        );
    }
    Ok(loaded)
}

/// Removes `.` and folds `dir/..` without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn display_name(path: &Path) -> String {
    let text = path.display().to_string();
    text.strip_prefix("./").unwrap_or(&text).to_owned()
}

/// Loads one file and its imports depth-first; `stack` holds the files being
/// loaded, to detect cycles.
fn load_file(
    loaded: &mut Loaded,
    name: String,
    path: PathBuf,
    bytes: Vec<u8>,
    stack: &mut Vec<FileId>,
) -> FileId {
    loaded.read_paths.push(path.clone());
    let (text, utf8_error) = match String::from_utf8(bytes) {
        Ok(text) => (text, None),
        Err(error) => {
            let at = error.utf8_error().valid_up_to();
            (
                String::from_utf8_lossy(error.as_bytes()).into_owned(),
                Some(at),
            )
        }
    };
    let id = loaded.sources.add(name, path.clone(), text);
    if let Some(at) = utf8_error {
        // The bad bytes became one U+FFFD in the stored text: mark all of it,
        // so the span ends on a character boundary.
        let end = at
            + loaded.sources.text(id)[at..]
                .chars()
                .next()
                .map_or(0, char::len_utf8);
        loaded.diagnostics.push(
            Diagnostic::error(
                ErrorCode::InvalidUtf8,
                Span::new(id, at, end),
                "this file is not valid UTF-8",
            )
            .with_label("invalid byte sequence here")
            .with_help("save the contract as UTF-8"),
        );
        return id;
    }
    let parsed = match syntax::parse_file_all_errors(id, loaded.sources.text(id)) {
        Ok(file) => file,
        Err(mut diagnostics) => {
            loaded.diagnostics.append(&mut diagnostics);
            return id;
        }
    };
    stack.push(id);
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut direct = Vec::new();
    for item in &parsed.items {
        let ast::Item::Import(import) = item else {
            continue;
        };
        let target = base.join(&import.path);
        // Shown relative to how the importing file was named, never absolute,
        // so messages (and the UI tests) do not depend on the machine.
        let shown_base = Path::new(loaded.sources.name(id))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let mut shown = display_name(&normalize(&shown_base.join(&import.path)));
        let beside = std::fs::canonicalize(&target).ok();
        let found = beside.or_else(|| {
            loaded.include_paths.iter().find_map(|dir| {
                let candidate = dir.join(&import.path);
                let canonical = std::fs::canonicalize(&candidate).ok()?;
                shown = display_name(&normalize(&candidate));
                Some(canonical)
            })
        });
        let Some(canonical) = found else {
            loaded.diagnostics.push(
                Diagnostic::error(
                    ErrorCode::ImportNotFound,
                    import.path_span,
                    format!("cannot find imported file `{}`", import.path),
                )
                .with_label(format!("looked for {shown}"))
                .with_help("import paths are relative to the importing file"),
            );
            continue;
        };
        if let Some(existing) = loaded.sources.find(&canonical) {
            if let Some(position) = stack.iter().position(|f| *f == existing) {
                let mut chain: Vec<&str> = stack[position..]
                    .iter()
                    .map(|f| loaded.sources.name(*f))
                    .collect();
                chain.push(loaded.sources.name(existing));
                let diagnostic = if chain.len() == 2 {
                    Diagnostic::error(
                        ErrorCode::ImportCycle,
                        import.span,
                        "a file cannot import itself",
                    )
                    .with_label("imports the file it is in")
                    .with_help("remove this import: a file always sees its own types")
                } else {
                    Diagnostic::error(ErrorCode::ImportCycle, import.span, "import cycle")
                        .with_label("this import closes a cycle")
                        .with_note(format!("cycle: {}", chain.join(" -> ")))
                        .with_help(
                            "move the types the files share into another file that each of them imports",
                        )
                };
                loaded.diagnostics.push(diagnostic);
            } else {
                direct.push(existing);
            }
            continue;
        }
        match std::fs::read(&canonical) {
            Ok(bytes) => {
                direct.push(load_file(loaded, shown, canonical, bytes, stack));
            }
            Err(error) => loaded.diagnostics.push(
                Diagnostic::error(
                    ErrorCode::ImportNotFound,
                    import.path_span,
                    format!("cannot read imported file `{}`: {error}", import.path),
                )
                .with_label("imported here"),
            ),
        }
    }
    stack.pop();
    loaded.imports.insert(id, direct);
    loaded.files.insert(id, parsed);
    id
}
