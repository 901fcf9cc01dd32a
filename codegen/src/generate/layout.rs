//! Line-width decisions for templates that emit code already formatted.
//!
//! The templates in `templates/` lay generated code out exactly as
//! prettyplease prints it, so that generation needs no syn parse and no
//! prettyplease print (what that saves is measured in
//! [BENCHMARKS.md](https://github.com/rfidl/rfidl/blob/main/BENCHMARKS.md#contract-parse--check-generation-build-script-re-run)).
//! Most of that layout is fixed; the
//! few constructs whose layout depends on how long the contract's names are
//! (a struct literal, a call, a return type, an array of endpoint names) are
//! decided here, with prettyplease's margin: a group stays on one line when
//! the line, as printed up to its next possible break, is at most [`MARGIN`]
//! bytes long (or, for a line indented past column 29, at most 60 bytes past
//! its indent: prettyplease's minimum space).
//!
//! What this module does not model is caught by [`check_item`]: an item with
//! a line longer than the margin that is not one of the known long lines
//! (doc comments, string constants, the payload decoding call) goes through
//! syn + prettyplease instead (the per-item fallback). The fast output is
//! tested to be a fixed point of prettyplease on every contract set the
//! tests have and on names swept across every width threshold
//! (`tests/it/fast_layout.rs`).
//!
//! Never formats by itself and never reads anything but the views.

use std::borrow::Cow;

use super::templates::{AioLayout, FieldView, MethodLayout, MethodView};

/// prettyplease's line width (`prettyplease::MARGIN`, 0.2).
pub const MARGIN: usize = 89;

/// The fewest columns prettyplease gives a line however deep its indent
/// (`prettyplease::MIN_SPACE`, 0.2): from column 29 on, a line may pass
/// [`MARGIN`].
const MIN_SPACE: usize = 60;

/// `width` bytes fit on a line that starts at column `indent` (with
/// prettyplease's margin, and its minimum space for deep lines).
fn fits(indent: usize, width: usize) -> bool {
    width <= MARGIN.saturating_sub(indent).max(MIN_SPACE)
}

/// prettyplease breaks a struct literal whose fields are wider than this,
/// wherever it is (`expr_struct`'s `end_with_max_width(34)`).
const STRUCT_LITERAL_MAX_WIDTH: usize = 34;

/// The length of `items` joined by `", "` (each preceded by `prefix`).
fn joined_len<'a>(items: impl Iterator<Item = &'a str>, prefix: &str) -> usize {
    let mut len = 0;
    let mut count: usize = 0;
    for item in items {
        len += prefix.len() + item.len();
        count += 1;
    }
    len + count.saturating_sub(1) * 2
}

/// A string literal's length as the `rust_str` filter spells it.
fn str_literal_len(value: &str) -> usize {
    if value
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' || b == b' ')
    {
        value.len() + 2
    } else {
        format!("{value:?}").len()
    }
}

/// `endpoints: &["A", "B"],` at `indent` fits on one line.
pub(crate) fn endpoints_inline(indent: usize, methods: &[MethodView]) -> bool {
    let names: usize = methods.iter().map(|m| str_literal_len(&m.name)).sum();
    let len = "endpoints: &[".len() + names + methods.len().saturating_sub(1) * 2 + "],".len();
    indent + len <= MARGIN
}

/// `let request = R { a, b };` at `indent` (a client's function body) fits
/// on one line. prettyplease breaks a struct literal wider than 34
/// (`R { a, b ` up to the closing brace) even when the line would fit.
fn request_inline(indent: usize, request: &str, params: &[FieldView]) -> bool {
    let names = params.iter().map(|p| p.rust_name.as_str());
    let literal = request.len() + " { ".len() + joined_len(names, "") + " ".len();
    literal <= STRUCT_LITERAL_MAX_WIDTH
        && fits(indent, "let request = ".len() + literal + "};".len())
}

/// The width decisions of one method (see [`MethodLayout`]).
pub(crate) fn method_layout(
    method_name: &str,
    fn_name: &str,
    request: &str,
    response_type: &str,
    has_response: bool,
    params: &[FieldView],
) -> MethodLayout {
    let names = || params.iter().map(|p| p.rust_name.as_str());
    let request_inline = request_inline(12, request, params);
    // `) -> ::std::result::Result<T, ::rfidl_runtime::receiver::HandlerError>;` (` {`).
    let result = [
        ") -> ::std::result::Result<",
        response_type,
        ", ::rfidl_runtime::receiver::HandlerError>",
    ];
    let result_len = result.iter().map(|part| part.len()).sum::<usize>();
    // `self.0.f(call, tx, request.a)?;` in the receiver's match arm.
    let call_args = "call, tx".len() + joined_len(names(), "request.") + 2 * params.len().min(1);
    let call = ".".len() + fn_name.len() + "(".len() + call_args + ")?;".len();
    let receiver_call_inline = if has_response {
        20 + "let response = self.0".len() + call <= MARGIN
    } else {
        20 + "self.0".len() + call <= MARGIN
    };
    // `(**self).f(call, tx, a)` in the `Arc` impl.
    let forward = ".".len()
        + fn_name.len()
        + "(call, tx".len()
        + joined_len(names(), "")
        + 2 * params.len().min(1)
        + ")".len();
    // `self.0.f(answer, tx, response)` in the answer router's match arm.
    let answer = ".".len() + fn_name.len() + "(answer, tx, response)".len();
    MethodLayout {
        request_inline,
        answer_call_inline: 20 + "self.0".len() + answer <= MARGIN,
        answer_args_inline: 24 + answer <= MARGIN,
        endpoint_inline: 20
            + "endpoint: ".len()
            + str_literal_len(method_name)
            + ".to_owned(),".len()
            <= MARGIN,
        forward_inline: 12 + "(**self)".len() + forward <= MARGIN,
        forward_args_inline: 16 + forward <= MARGIN,
        correlation_inline: true,
        result_inline_decl: 8 + result_len + ";".len() <= MARGIN,
        result_inline_impl: 8 + result_len + " {".len() <= MARGIN,
        receiver_call_inline,
        receiver_args_inline: 24 + call <= MARGIN,
    }
}

/// The width decisions of one method's async code in the `aio` submodule
/// (see [`AioLayout`]): its client and `Arc` impl are one level deeper than
/// the blocking ones, its match arms two (`Box::pin(async move { match … })`),
/// each call is awaited, and the parent's items are named `super::…`.
pub(crate) fn aio_method_layout(
    fn_name: &str,
    request: &str,
    has_response: bool,
    params: &[FieldView],
) -> AioLayout {
    let names = || params.iter().map(|p| p.rust_name.as_str());
    let then_params = 2 * params.len().min(1);
    // `.f(call, conn, request.a)` in the receiver's match arm, at column 28;
    // broken, each call of the chain is on its own line at 32.
    let call = ".".len()
        + fn_name.len()
        + "(call, conn".len()
        + then_params
        + joined_len(names(), "request.")
        + ")".len();
    let receiver_call_inline = if has_response {
        fits(28, "let response = self.0".len() + call + ".await?;".len())
    } else {
        fits(28, "self.0".len() + call + ".await?;".len())
    };
    // `(**self).f(call, conn, a)` in the `Arc` impl, at column 16.
    let forward = ".".len()
        + fn_name.len()
        + "(call, conn".len()
        + then_params
        + joined_len(names(), "")
        + ")".len();
    // `.f(answer, conn, response)` in the answer router's match arm.
    let answer = ".".len() + fn_name.len() + "(answer, conn, response)".len();
    AioLayout {
        request_inline: request_inline(16, &format!("super::{request}"), params),
        receiver_call_inline,
        receiver_args_inline: fits(32, call),
        forward_inline: fits(16, "(**self)".len() + forward),
        forward_args_inline: fits(20, forward),
        answer_call_inline: fits(28, "self.0".len() + answer + ".await".len()),
        answer_args_inline: fits(32, answer),
    }
}

/// The `aio` answer router's impl header keeps `for <router><H> {` on the
/// line of its trait (`> ::rfidl_runtime::responses::AsyncResponseHandler<S>`).
pub(crate) fn aio_answer_router_for_inline(router: &str) -> bool {
    let header = "> ::rfidl_runtime::responses::AsyncResponseHandler<S> for ".len();
    fits(8, header + router.len() + "<H> {".len())
}

/// The `aio` failure router's impl header keeps `for <router><H> {` on the
/// line of its trait (`> ::rfidl_runtime::failures::AsyncFailureHandler<S>`).
pub(crate) fn aio_failure_router_for_inline(router: &str) -> bool {
    let header = "> ::rfidl_runtime::failures::AsyncFailureHandler<S> for ".len();
    fits(8, header + router.len() + "<H> {".len())
}

/// The `aio` failure trait's header (`pub trait <name><S: …AsyncStore>:
/// Send + Sync + 'static {`) fits on one line; else its generic parameter
/// goes on a line of its own.
pub(crate) fn aio_failures_header_inline(name: &str) -> bool {
    let rest = "<S: ::rfidl_runtime::AsyncStore>: Send + Sync + 'static {".len();
    fits(8, "pub trait ".len() + name.len() + rest)
}

/// A Rust type written from column `column` on a line whose item starts at
/// `indent`, followed by `trailing` bytes (`,`): as is when it fits, else
/// broken as prettyplease breaks generic arguments, one per line at
/// `indent + 4`, each laid out the same way. A type without generic
/// arguments cannot break; its line stays long (and [`check_item`] refuses
/// it).
pub(crate) fn type_at(ty: &str, indent: usize, column: usize, trailing: usize) -> Cow<'_, str> {
    if fits(indent, column - indent + ty.len() + trailing) {
        return Cow::Borrowed(ty);
    }
    let mut out = String::with_capacity(ty.len() + 64);
    break_type(&mut out, ty, indent, column, trailing);
    Cow::Owned(out)
}

fn break_type(out: &mut String, ty: &str, indent: usize, column: usize, trailing: usize) {
    let generic = ty.find('<').filter(|_| ty.ends_with('>'));
    let Some(open) = generic.filter(|_| !fits(indent, column - indent + ty.len() + trailing))
    else {
        out.push_str(ty);
        return;
    };
    out.push_str(&ty[..=open]);
    let inner = indent + 4;
    for arg in split_top_level(&ty[open + 1..ty.len() - 1]) {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', inner));
        break_type(out, arg, inner, inner, 0);
        out.push(',');
    }
    out.push('\n');
    out.extend(std::iter::repeat_n(' ', indent));
    out.push('>');
}

/// `a, B<c, d>, e` -> `a`, `B<c, d>`, `e`.
fn split_top_level(args: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0usize;
    let mut start = 0;
    let mut parts = Vec::new();
    for (index, byte) in args.bytes().enumerate() {
        match byte {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' | b')' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                parts.push(args[start..index].trim());
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(args[start..].trim());
    parts.into_iter()
}

/// `correlation_id: <expr>,` in the client's `OutgoingMessage` fits on one
/// line.
pub(crate) fn correlation_inline(expr: &str) -> bool {
    20 + "correlation_id: ".len() + expr.len() + ",".len() <= MARGIN
}

/// Lines longer than the margin that prettyplease cannot break either, so
/// the fast layout may have them: doc comments, string constants, the
/// payload decoding call whose argument is already on its own line, and a
/// client's request literal whose fields are.
fn long_line_is_known(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("///")
        || line.starts_with("pub const INTERFACE: &str = \"")
        || line.starts_with("pub const FINGERPRINT: &str = \"")
        || line.starts_with("pub const MANIFEST_JSON: &str = r")
        || line
            == "pub const HOSTED: ::rfidl_runtime::receiver::HostedInterface = ::rfidl_runtime::receiver::HostedInterface {"
        || (line.starts_with("let ")
            && line.ends_with(" = ::rfidl_runtime::receiver::decode_payload("))
        || (line.starts_with("let request = ") && line.ends_with("Request {"))
}

/// The first line of `rendered` that makes [`check_item`] refuse it: longer
/// than prettyplease's margin (or, indented past column 29, than its minimum
/// space), and not one of the lines prettyplease leaves long too.
pub fn unvouched_line(rendered: &str) -> Option<&str> {
    rendered.lines().find(|line| {
        let text = line.trim_start();
        !fits(line.len() - text.len(), text.len()) && !long_line_is_known(line)
    })
}

/// Finishes one item rendered by a fast template: trailing spaces dropped
/// (prettyplease prints `///` for an empty doc line), one newline at the
/// end. `None` when the item has a line this module cannot vouch for: then
/// the caller formats it with syn + prettyplease.
pub fn check_item(rendered: &str) -> Option<String> {
    let text = rendered.trim_start_matches('\n').trim_end();
    // A carriage return (a bare one is not allowed in a doc comment) would
    // hide from `lines()`: let syn judge it.
    if unvouched_line(text).is_some() || text.contains('\r') {
        return None;
    }
    let trailing_spaces = text.lines().any(|line| line.ends_with(' '));
    let mut out = String::with_capacity(text.len() + 1);
    if trailing_spaces {
        for line in text.lines() {
            out.push_str(line.trim_end_matches(' '));
            out.push('\n');
        }
    } else {
        out.push_str(text);
        out.push('\n');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_item_vouches_only_for_lines_it_knows() {
        let wide = format!("pub struct S {{\n    pub f: {},\n}}\n", "A".repeat(90));
        assert_eq!(
            check_item(&wide),
            None,
            "a wide field prettyplease may break"
        );
        let doc = format!(
            "\n/// {}\npub struct S {{}}\n",
            "word ".repeat(30).trim_end()
        );
        assert_eq!(
            check_item(&doc).as_deref(),
            Some(&doc[1..]),
            "doc lines stay long"
        );
        assert_eq!(
            check_item("///  \n/// a \npub struct S {}\n\n").as_deref(),
            Some("///\n/// a\npub struct S {}\n"),
            "trailing spaces go, as prettyplease drops them"
        );
        assert_eq!(check_item("/// a\rb\npub struct S {}\n"), None);
    }

    #[test]
    fn a_type_breaks_outside_in_one_argument_per_line() {
        assert_eq!(type_at("Vec<String>", 4, 13, 1), "Vec<String>");
        let long = format!(
            "Option<::std::collections::BTreeMap<String, R{}>>",
            "a".repeat(43)
        );
        assert_eq!(
            type_at(&long, 4, 13, 1),
            format!(
                "Option<\n        ::std::collections::BTreeMap<\n            String,\n            R{}\n        >,\n    >",
                "a".repeat(43) + ","
            )
        );
    }
}
