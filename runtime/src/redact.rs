//! Value-free error messages.
//!
//! serde's messages quote the value they refused (``invalid type: string
//! "whsec_…", expected u32``, ``unknown variant `Salary 250000 EUR`, …``).
//! A payload may hold personal data and a config file holds secrets, so
//! neither may reach an answer, a log line or a diagnostics route.
//! [`value_free`] keeps what helps the reader (the path, the kind of value
//! found, what was expected, schema field names) and drops every value.
//!
//! It recognises serde's standard messages; any other message (a type's own
//! parse error, which may quote its input) becomes `invalid value`.

/// `message` without the values it quotes.
///
/// * ``invalid type: string "x", expected u32`` -> `invalid type: string, expected u32`
/// * ``unknown variant `x`, expected one of `A`, `B` `` -> ``unknown variant, expected one of `A`, `B` ``
/// * ``missing field `name` `` stays (a name made only of letters, digits, `_` and `-`)
/// * ``outbox.ttl: invalid duration `soon` …`` -> `outbox.ttl: invalid value`
///
/// The text after the last `, expected ` of a standard message comes from
/// the type being decoded (serde's `Visitor::expecting`), never from the
/// input, and any quoted value sits before it, so that tail is kept.
pub fn value_free(message: &str) -> String {
    let (path, body) = split_path(message);
    format!("{path}{}", body_value_free(body))
}

/// A serde_json error without values: syntax and end-of-input errors as
/// they are (they hold a position, never a value), data errors through
/// [`value_free`].
pub fn json_error(error: &serde_json::Error) -> String {
    match error.classify() {
        serde_json::error::Category::Data => value_free(&error.to_string()),
        _ => error.to_string(),
    }
}

/// A connection URL without its password:
/// `postgres://app:s3cret@db:5432/app` becomes `postgres://app:***@db:5432/app`.
/// Anything that is not `scheme://user:password@…` is returned as it is.
pub fn url_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = authority[..at].find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..scheme_end + 3],
        &authority[..colon],
        &rest[at..]
    )
}

/// A destination's URL without its secrets: [`url_password`], and in an
/// Azure Service Bus connection string
/// (`Endpoint=sb://…;SharedAccessKeyName=…;SharedAccessKey=…`) the
/// `SharedAccessKey` and `SharedAccessSignature` values as `***`.
pub fn destination_url(url: &str) -> String {
    if !url
        .trim_start()
        .get(..9)
        .is_some_and(|head| head.eq_ignore_ascii_case("endpoint="))
    {
        return url_password(url);
    }
    url.split(';')
        .map(|part| match part.split_once('=') {
            Some((name, _))
                if name.trim().eq_ignore_ascii_case("SharedAccessKey")
                    || name.trim().eq_ignore_ascii_case("SharedAccessSignature") =>
            {
                format!("{name}=***")
            }
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// A leading `outbox.ttl: ` or `peers.hr[0]: ` (serde_yaml's path prefix).
fn split_path(message: &str) -> (&str, &str) {
    if let Some(at) = message.find(": ") {
        let path = &message[..at];
        let path_like = !path.is_empty()
            && !path.contains(' ')
            && path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-[]".contains(c));
        if path_like {
            return message.split_at(at + 2);
        }
    }
    ("", message)
}

fn body_value_free(body: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = body.strip_prefix(prefix) {
            let kind_end = rest.find(['`', '"', ',']).unwrap_or(rest.len());
            let kind = rest[..kind_end].trim();
            let kind = if kind.chars().all(|c| c.is_ascii_alphabetic() || c == ' ') {
                kind
            } else {
                "value"
            };
            return format!("{}{kind}{}", prefix, expected_tail(rest, ", expected "));
        }
    }
    if let Some(rest) = body.strip_prefix("invalid length ") {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits > 0 && rest[digits..].starts_with(", expected ") {
            return body.to_owned();
        }
        return "invalid length".to_owned();
    }
    if let Some(rest) = body.strip_prefix("unknown variant `") {
        return format!("unknown variant{}", quoted_tail(rest, "variants"));
    }
    for (prefix, label) in [
        ("unknown field `", "unknown field"),
        ("missing field `", "missing field"),
        ("duplicate field `", "duplicate field"),
    ] {
        if let Some(rest) = body.strip_prefix(prefix) {
            let none = "`, there are no fields";
            let (name, tail) = if let Some(name) = rest.strip_suffix(none) {
                (name, &none[1..])
            } else if let Some(at) = rest.rfind("`, expected ") {
                (&rest[..at], &rest[at + 1..])
            } else {
                (rest.strip_suffix('`').unwrap_or(rest), "")
            };
            let schema_name = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            return if schema_name {
                format!("{label} `{name}`{tail}")
            } else {
                format!("{label}{tail}")
            };
        }
    }
    "invalid value".to_owned()
}

/// `, expected …` after the last `marker` in `rest`, or nothing.
fn expected_tail<'a>(rest: &'a str, marker: &str) -> &'a str {
    rest.rfind(marker).map_or("", |at| &rest[at..])
}

/// After a backtick-quoted value: the `, expected …` tail (found from the
/// end, so a value containing the marker cannot end early) or `, there are
/// no {what}`.
fn quoted_tail(rest: &str, what: &str) -> String {
    // First the form without a list: a listed name always ends in a backtick.
    let none = format!("`, there are no {what}");
    if rest.ends_with(&none) {
        return none[1..].to_owned();
    }
    if let Some(at) = rest.rfind("`, expected ") {
        return rest[at + 1..].to_owned();
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_urls_hide_connection_string_keys_and_passwords() {
        assert_eq!(
            destination_url(
                "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;\
                 SharedAccessKey=c2VjcmV0PQ==;EntityPath=orders"
            ),
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;\
             SharedAccessKey=***;EntityPath=orders"
        );
        assert_eq!(
            destination_url("amqps://send:k3y@ns.servicebus.windows.net/orders"),
            "amqps://send:***@ns.servicebus.windows.net/orders"
        );
    }

    #[test]
    fn url_passwords_are_hidden_and_the_rest_kept() {
        assert_eq!(
            url_password("postgres://app:s3cret@db.internal:5432/app?sslmode=disable"),
            "postgres://app:***@db.internal:5432/app?sslmode=disable"
        );
        assert_eq!(
            url_password("postgres://app@db/app"),
            "postgres://app@db/app"
        );
        assert_eq!(url_password("/srv/hr.db"), "/srv/hr.db");
        assert_eq!(
            url_password("postgresql://u:p@ss@h/d"),
            "postgresql://u:***@h/d"
        );
    }

    use super::value_free;

    #[test]
    fn json_errors_keep_positions_and_drop_values() {
        let syntax = serde_json::from_str::<serde_json::Value>("[1,").unwrap_err();
        assert_eq!(
            super::json_error(&syntax),
            "EOF while parsing a value at line 1 column 3"
        );
        let data = serde_json::from_str::<Vec<std::collections::BTreeMap<String, u32>>>(
            r#"[{"a": "SECRET"}]"#,
        )
        .unwrap_err();
        assert_eq!(
            super::json_error(&data),
            "invalid type: string, expected u32 at line 1 column 15"
        );
    }

    #[test]
    fn quoted_values_are_dropped() {
        let cases = [
            (
                "invalid type: string \"whsec_secret\", expected u32",
                "invalid type: string, expected u32",
            ),
            (
                "unknown variant `Salary 250000 EUR; bonus`, expected one of `Permanent`, `Contractor`",
                "unknown variant, expected one of `Permanent`, `Contractor`",
            ),
            (
                "invalid value: integer `-4`, expected u32",
                "invalid value: integer, expected u32",
            ),
            (
                "outbox.ttl: invalid duration `soon`: empty (expected e.g. \"500ms\") at line 2 column 8",
                "outbox.ttl: invalid value",
            ),
            ("missing field `name`", "missing field `name`"),
            (
                "outbox: unknown field `poll`, expected one of `poll_interval`",
                "outbox: unknown field `poll`, expected one of `poll_interval`",
            ),
            (
                "unknown field `Salary 250000`, expected one of `a`",
                "unknown field, expected one of `a`",
            ),
            (
                "invalid length 3, expected a tuple of size 2",
                "invalid length 3, expected a tuple of size 2",
            ),
            // A value that holds the marker cannot end the value early.
            (
                "unknown variant `a, expected b`, expected one of `A`",
                "unknown variant, expected one of `A`",
            ),
            (
                "unknown variant `x`, expected SECRET`, there are no variants",
                "unknown variant, there are no variants",
            ),
            (
                "invalid type: string \"a, expected SECRET\", expected u32",
                "invalid type: string, expected u32",
            ),
            ("invalid duration `x, expected SECRET`", "invalid value"),
            (
                "invalid character: expected an optional prefix of `urn:uuid:` followed by [0-9a-fA-F-], found `S` at 1",
                "invalid value",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(value_free(input), expected, "{input}");
        }
    }
}
