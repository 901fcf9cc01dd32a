//! An error's message with its causes.

/// `error: cause: cause …`, each cause once. Client libraries (reqwest,
/// postgres) put the reason an operator needs (connection refused, an
/// untrusted certificate) in their errors' sources, not in the top message.
pub(crate) fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
