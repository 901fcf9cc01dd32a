//! `rfidl messages`: the dead letters of a running service, through its
//! operator routes under `/_rf/outbox/` (docs/operations.md): list them,
//! count them per destination and error, show one, retry or discard them.
//!
//! Only metadata crosses: the routes never answer a payload, and nothing
//! here asks for one. Tables go to stdout (`text`), or the service's own
//! JSON, one document per line (`json`); every error goes to stderr (text
//! `error[code]: message (HTTP status)`, or a JSON line), exit 2, so that
//! stdout holds results only.

use std::time::Duration;

use serde_json::Value;

use crate::report::{DiagnosticFormat, Outcome, Report};

/// The largest page the service gives (`MAX_LIST_LIMIT`): used when the
/// whole list is followed.
const FULL_PAGE: u32 = 1000;

/// A running service's operator routes: its base URL and the bearer token
/// sent with every request, if any.
#[derive(Debug)]
pub struct MessagesService {
    base: String,
    token: Option<String>,
    client: reqwest::blocking::Client,
}

/// The filter of `list`, `groups` and `show` (each `None` is left out of
/// the query): `status` (`Failed`, `DeadLetter`, `Expired`), `destination`,
/// `interface`, `method`, `error` (text of the last error) and `older_than` (a
/// duration such as `1h`). The service checks them and refuses a bad one
/// (400 `bad_request`).
#[derive(Debug, Clone, Default)]
pub struct FailedFilter {
    /// `Failed`, `DeadLetter` or `Expired`.
    pub status: Option<String>,
    /// A destination name.
    pub destination: Option<String>,
    /// A receiving interface, `package.Service`.
    pub interface: Option<String>,
    /// A method name.
    pub method: Option<String>,
    /// Text the last error contains (a group's error code matches its
    /// messages).
    pub error: Option<String>,
    /// Only messages created longer ago than this duration (`1h30m`).
    pub older_than: Option<String>,
}

/// Which pages `list` reads: all of them (following `nextCursor`), or one.
#[derive(Debug, Clone, Default)]
pub enum Pages {
    /// Every page, following `nextCursor` to the end.
    #[default]
    All,
    /// One page: at most `limit` messages (the service's default without
    /// it), from `cursor` (the start without it).
    One {
        /// At most this many messages (1 to 1,000).
        limit: Option<u32>,
        /// The `nextCursor` of the previous page.
        cursor: Option<String>,
    },
}

/// What `retry` and `discard` act on.
#[derive(Debug, Clone)]
pub enum Selection {
    /// One message, by id.
    One(String),
    /// Every `Failed`, `DeadLetter` and `Expired` message matching the
    /// filter (the default filter matches them all).
    Matching(FailedFilter),
}

/// Why a call failed: the service's refusal, or no answer at all.
enum CallError {
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    Unreachable(String),
}

impl MessagesService {
    /// The service at `base_url` (`http://host:port`), sending `token` as
    /// `Authorization: Bearer` if given.
    pub fn new(base_url: &str, token: Option<String>) -> Result<Self, String> {
        let base = base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(format!(
                "--service `{base_url}` is not an http:// or https:// URL"
            ));
        }
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            base,
            token,
            client,
        })
    }

    fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Value, CallError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.request(method, &url).query(query);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().map_err(|e| {
            CallError::Unreachable(format!(
                "cannot reach the service at {}: {}",
                self.base,
                rfidl_codegen::registry::client::error_chain(&e)
            ))
        })?;
        let status = response.status();
        let text = response
            .text()
            .map_err(|e| CallError::Unreachable(format!("the answer of {url} was cut off: {e}")))?;
        let body: Option<Value> = serde_json::from_str(&text).ok();
        if status.is_success() {
            return body.ok_or_else(|| {
                CallError::Unreachable(format!(
                    "{url} answered {status} without JSON: is {} an rfidl service?",
                    self.base
                ))
            });
        }
        let field = |name: &str| {
            body.as_ref()
                .and_then(|b| b[name].as_str())
                .map(str::to_owned)
        };
        Err(CallError::Refused {
            status: status.as_u16(),
            code: field("error").unwrap_or_else(|| format!("http_{}", status.as_u16())),
            message: field("message").unwrap_or_else(|| {
                format!("{url} answered {status} (not an rfidl diagnostics route?)")
            }),
        })
    }

    fn failed_page(
        &self,
        filter: &FailedFilter,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<(Vec<Value>, Option<String>), CallError> {
        let mut query = filter.query();
        if let Some(limit) = limit {
            query.push(("limit", limit.to_string()));
        }
        if let Some(cursor) = cursor {
            query.push(("cursor", cursor.to_owned()));
        }
        let page = self.call(reqwest::Method::GET, "/_rf/outbox/failed", &query)?;
        let messages = page["messages"].as_array().cloned().unwrap_or_default();
        let next = page["nextCursor"].as_str().map(str::to_owned);
        Ok((messages, next))
    }

    /// Every message of the filter, following `nextCursor`; `until` stops
    /// early at the first message it accepts.
    fn failed_all(
        &self,
        filter: &FailedFilter,
        until: impl Fn(&Value) -> bool,
    ) -> Result<Vec<Value>, CallError> {
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let (messages, next) = self.failed_page(filter, Some(FULL_PAGE), cursor.as_deref())?;
            let found = messages.iter().any(&until);
            all.extend(messages);
            match next {
                Some(next) if !found => cursor = Some(next),
                _ => return Ok(all),
            }
        }
    }
}

impl FailedFilter {
    fn query(&self) -> Vec<(&'static str, String)> {
        [
            ("status", &self.status),
            ("destination", &self.destination),
            ("interface", &self.interface),
            ("method", &self.method),
            ("error", &self.error),
            ("olderThan", &self.older_than),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.clone().map(|v| (name, v)))
        .collect()
    }
}

/// Prints a failed call on stderr and gives its exit code, 2: a refusal
/// with the service's code and status, no answer with its cause.
fn failed(error: CallError, report: &Report) -> Outcome {
    match error {
        CallError::Refused {
            status,
            code,
            message,
        } => print_error(Some(&code), Some(status), &message, report),
        CallError::Unreachable(message) => print_error(None, None, &message, report),
    }
    Outcome::UsageOrIo
}

/// How `rfidl messages` reports an error of its own (a token file it cannot
/// read, a `--service` that is no URL): on stderr, like a refusal, so that
/// stdout holds results only. Exit 2.
pub fn messages_error(message: &str, report: &Report) -> Outcome {
    print_error(None, None, message, report);
    Outcome::UsageOrIo
}

/// One error on stderr: text `error[code]: message (HTTP status)`, json
/// `{"severity": "error", "code", "status", "message"}` (`code` and
/// `status` null when the service did not answer).
fn print_error(code: Option<&str>, status: Option<u16>, message: &str, report: &Report) {
    if report.format == DiagnosticFormat::Json {
        let line = serde_json::json!({
            "severity": "error",
            "code": code,
            "status": status,
            "message": message,
        });
        eprintln!("{line}");
        return;
    }
    let code = code.map_or_else(String::new, |code| format!("[{code}]"));
    let status = status.map_or_else(String::new, |status| format!(" (HTTP {status})"));
    eprintln!("{}{code}: {message}{status}", report.error_word());
}

/// `rfidl messages list`: the `Failed`, `DeadLetter` and `Expired` messages
/// of the filter, oldest first. Text: a table (id, status, destination,
/// method, retries, created, last error); json: `{"messages": [...]}` plus
/// `nextCursor` when one page was asked and more follow. Exit 2 when the
/// service refuses (its code and message on stderr) or cannot be reached.
pub fn messages_list(
    service: &MessagesService,
    filter: &FailedFilter,
    pages: &Pages,
    report: &Report,
) -> Outcome {
    let answer = match pages {
        Pages::All => service.failed_all(filter, |_| false).map(|all| (all, None)),
        Pages::One { limit, cursor } => service.failed_page(filter, *limit, cursor.as_deref()),
    };
    let (messages, next) = match answer {
        Ok(answer) => answer,
        Err(error) => return failed(error, report),
    };
    if report.format == DiagnosticFormat::Json {
        let mut answer = serde_json::json!({ "messages": messages });
        if let Some(next) = &next {
            answer["nextCursor"] = next.clone().into();
        }
        report.json_line(&answer);
        return Outcome::Success;
    }
    let rows: Vec<Vec<String>> = messages
        .iter()
        .map(|m| {
            vec![
                text(&m["messageId"]),
                text(&m["status"]),
                text(&m["destination"]),
                format!(
                    "{} v{}.{}",
                    text(&m["interface"]),
                    text(&m["version"]),
                    text(&m["endpoint"])
                ),
                format!("{}/{}", text(&m["retryCount"]), text(&m["maxRetries"])),
                text(&m["createdAt"]),
                one_line(&text(&m["lastError"])),
            ]
        })
        .collect();
    let headers = [
        "ID",
        "STATUS",
        "DESTINATION",
        "METHOD",
        "RETRIES",
        "CREATED",
        "LAST ERROR",
    ];
    print_table(&headers, &rows, report);
    let count = messages.len();
    eprintln!(
        "{count} message{}{}",
        crate::report::plural(count),
        next.map_or_else(String::new, |next| format!(
            "; more follow: --cursor {next}"
        ))
    );
    Outcome::Success
}

/// `rfidl messages groups`: the same messages counted per destination and
/// error code, with the oldest and newest. Text: a table; json: the
/// service's `{"groups": [...]}`. Exit 2 as `list`.
pub fn messages_groups(
    service: &MessagesService,
    filter: &FailedFilter,
    report: &Report,
) -> Outcome {
    let answer = match service.call(
        reqwest::Method::GET,
        "/_rf/outbox/failed/groups",
        &filter.query(),
    ) {
        Ok(answer) => answer,
        Err(error) => return failed(error, report),
    };
    if report.format == DiagnosticFormat::Json {
        report.json_line(&answer);
        return Outcome::Success;
    }
    let rows: Vec<Vec<String>> = answer["groups"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|g| {
            ["destination", "errorCode", "count", "oldest", "newest"]
                .iter()
                .map(|field| text(&g[*field]))
                .collect()
        })
        .collect();
    print_table(
        &["DESTINATION", "ERROR", "COUNT", "OLDEST", "NEWEST"],
        &rows,
        report,
    );
    Outcome::Success
}

/// The fields `show` prints, in order, with their labels. A payload is not
/// among them (the service never sends one).
const SHOWN: [(&str, &str); 14] = [
    ("messageId", "id"),
    ("status", "status"),
    ("messageType", "type"),
    ("destination", "destination"),
    ("interface", "interface"),
    ("version", "version"),
    ("endpoint", "method"),
    ("correlationId", "correlation id"),
    ("traceId", "trace id"),
    ("retryCount", "attempts"),
    ("maxRetries", "max retries"),
    ("createdAt", "created"),
    ("lastAttemptAt", "last attempt"),
    ("expiresAt", "expires"),
];

/// `rfidl messages show ID`: one message of the failed list (its routing,
/// attempts, last error, status, times and trace id when the service gives
/// one; never a payload). Text: `label: value` lines; json: the list's
/// object. Exit 2 when no `Failed`, `DeadLetter` or `Expired` message has
/// this id (`error[not_found]`), or as `list`.
pub fn messages_show(service: &MessagesService, message_id: &str, report: &Report) -> Outcome {
    let is_it = |m: &Value| m["messageId"].as_str() == Some(message_id);
    let all = match service.failed_all(&FailedFilter::default(), is_it) {
        Ok(all) => all,
        Err(error) => return failed(error, report),
    };
    let Some(message) = all.iter().find(|m| is_it(m)) else {
        print_error(
            Some("not_found"),
            None,
            &format!("no Failed, DeadLetter or Expired message has the id `{message_id}`"),
            report,
        );
        return Outcome::UsageOrIo;
    };
    if report.format == DiagnosticFormat::Json {
        report.json_line(message);
        return Outcome::Success;
    }
    let width = SHOWN
        .iter()
        .map(|(_, label)| label.len())
        .max()
        .unwrap_or(0)
        + 1;
    for (field, label) in SHOWN {
        if message[field].is_null() {
            continue;
        }
        report.stdout_line(&format!(
            "{:width$} {}",
            format!("{label}:"),
            text(&message[field])
        ));
    }
    let last_error = text(&message["lastError"]);
    report.stdout_line(&format!(
        "{:width$} {}",
        "last error:",
        if last_error.is_empty() {
            "(none)"
        } else {
            &last_error
        }
    ));
    Outcome::Success
}

/// `rfidl messages retry`: puts one message, or every one matching, back to
/// `Pending`. Text: `retried N message(s)` on stderr, and the service's
/// warning about the dedup horizon if any; json: the service's
/// `{"retried": n, "warning"?}`. Exit 2 when the service refuses (an
/// unknown id: `not_found`; no token configured: `token_required`; a wrong
/// token: `unauthorized`) or cannot be reached.
pub fn messages_retry(
    service: &MessagesService,
    selection: &Selection,
    report: &Report,
) -> Outcome {
    change(service, selection, "retry", "retried", report)
}

/// `rfidl messages discard`: puts one message, or every one matching, aside
/// as `Discarded` (never sent again; deleted by retention). Text:
/// `discarded N message(s)` on stderr; json: the service's
/// `{"discarded": n}`. Exit 2 as `retry` (`not_discardable` for a message
/// that is not failed).
pub fn messages_discard(
    service: &MessagesService,
    selection: &Selection,
    report: &Report,
) -> Outcome {
    change(service, selection, "discard", "discarded", report)
}

fn change(
    service: &MessagesService,
    selection: &Selection,
    action: &str,
    done: &str,
    report: &Report,
) -> Outcome {
    let (path, query) = match selection {
        Selection::One(id) => (format!("/_rf/outbox/{}/{action}", path_segment(id)), vec![]),
        Selection::Matching(filter) => (format!("/_rf/outbox/{action}"), filter.query()),
    };
    let answer = match service.call(reqwest::Method::POST, &path, &query) {
        Ok(answer) => answer,
        Err(error) => return failed(error, report),
    };
    if report.format == DiagnosticFormat::Json {
        report.json_line(&answer);
        return Outcome::Success;
    }
    let count = answer[done].as_u64().unwrap_or(0);
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    eprintln!("{done} {count} message{}", crate::report::plural(count));
    if let Some(warning) = answer["warning"].as_str() {
        report.warning(warning);
    }
    Outcome::Success
}

/// A message id as one path segment: anything but letters, digits and `-`
/// percent-encoded, so an id cannot reach another route.
fn path_segment(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A JSON value as a table cell: strings without quotes, `null` empty.
fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A cell on one line: line breaks and tabs become spaces.
fn one_line(cell: &str) -> String {
    cell.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Aligned columns separated by two spaces, the last one not padded; a
/// header line first. Nothing but the header when there are no rows.
fn print_table(headers: &[&str], rows: &[Vec<String>], report: &Report) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, width)) in cells.zip(&widths).enumerate() {
            if i + 1 == headers.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:width$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    report.stdout_line(&line(&mut headers.iter().copied()));
    for row in rows {
        report.stdout_line(&line(&mut row.iter().map(String::as_str)));
    }
}
