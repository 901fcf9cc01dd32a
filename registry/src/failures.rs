//! A service's failures on the dashboard, and the operator's retry and
//! discard of them (`docs/registry.md`, "Acting from the dashboard"):
//!
//! * `GET /dashboard/sign-in` and `POST /dashboard/sign-in`: the operator
//!   token once, for a session cookie ([`crate::session`]);
//! * `GET /services/{service}/failures`: each registered instance's
//!   failures grouped by destination and error code (its
//!   `/_rf/outbox/failed/groups`, asked with its diagnostics token), each
//!   group with a retry and a discard form, and the service's latest
//!   actions;
//! * `POST /services/{service}/failures/{retry|discard}`: the registry
//!   lists the group's messages (`/_rf/outbox/failed?destination=…`,
//!   keeping those whose error code is the group's) and retries or
//!   discards each (`/_rf/outbox/{id}/retry|discard`) with the instance's
//!   token, logs the action (the registry's log and `operator_actions`)
//!   and answers 303 back to the page.
//!
//! Every check (credential, form token, form, service, instance) comes
//! before the first request to the instance: a refused action changes
//! nothing. Plain HTML forms, no JavaScript.

use std::sync::Arc;

use askama::Template;
use axum::Form;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rusqlite::{Connection, OptionalExtension as _, params};
use serde::Deserialize;

use crate::aggregator::{self, BoundedRead, Target};
use crate::dashboard::{MAX_FAILED_BYTES, NoQuery, html_page};
use crate::session::{self, Actor};
use crate::{ApiError, Shared, authorize, now_ms, with_db};

/// Most messages one retry or discard acts on; a larger group takes more
/// presses (the page says how many are left).
pub const MAX_ACTION_MESSAGES: usize = 1000;
/// Actions kept per service in `operator_actions`.
pub const KEPT_ACTIONS: i64 = 1000;
/// Actions shown on a service's page.
const SHOWN_ACTIONS: i64 = 20;
/// Longest destination or error code a form may name.
const MAX_FIELD_CHARS: usize = 200;

fn see_other(location: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, location.to_owned())],
    )
        .into_response()
}

#[derive(Template)]
#[template(path = "sign_in.html")]
struct SignInPage {
    next: String,
}

/// `?next=PATH` of the sign-in page: where to go afterwards.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignInQuery {
    next: Option<String>,
}

/// `GET /dashboard/sign-in?next=PATH`.
pub(crate) async fn serve_sign_in_page(
    query: Result<Query<SignInQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; this page takes only ?next=PATH",
            e.body_text()
        ))
    })?;
    html_page(&SignInPage {
        next: session::local_path(query.next.as_deref()),
    })
}

/// The sign-in form.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignInForm {
    token: String,
    next: Option<String>,
}

/// `POST /dashboard/sign-in`: 303 to `next` with the session cookie; 401
/// `unauthorized` for a wrong token, 403 `operation_disabled` on a closed
/// registry without an operator token, 400 `bad_request` for another form.
pub(crate) async fn serve_sign_in(
    State(shared): State<Arc<Shared>>,
    form: Result<Form<SignInForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; the sign-in form has `token` and `next`",
            e.body_text()
        ))
    })?;
    shared
        .credentials
        .authorize_operator_token(&form.token)
        .inspect_err(|_| tracing::warn!("dashboard sign-in refused: wrong operator token"))?;
    let session = shared.session_key.issue(now_ms());
    tracing::info!("operator signed in to the dashboard");
    let mut response = see_other(&session::local_path(form.next.as_deref()));
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session::cookie(&session));
    Ok(response)
}

/// `POST /dashboard/sign-out`: 303 to `/` with the cookie cleared.
pub(crate) async fn serve_sign_out() -> Response {
    let mut response = see_other("/");
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session::expired_cookie());
    response
}

/// One group of `/_rf/outbox/failed/groups`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RemoteGroup {
    destination: String,
    error_code: String,
    count: u64,
    oldest: String,
    newest: String,
}

#[derive(Deserialize)]
struct RemoteGroups {
    groups: Vec<RemoteGroup>,
}

struct InstanceFailures {
    instance_id: String,
    base_url: String,
    /// Why its groups could not be read (shown: the operator's page).
    problem: Option<String>,
    groups: Vec<RemoteGroup>,
}

struct ActionRow {
    at: String,
    action: String,
    instance_id: String,
    destination: String,
    error_code: String,
    outcome: String,
}

#[derive(Template)]
#[template(path = "failures.html")]
struct FailuresPage {
    service: String,
    instances: Vec<InstanceFailures>,
    actions: Vec<ActionRow>,
    /// The form token; `None` without a session (forms then say sign in).
    csrf: Option<String>,
    sign_in_url: String,
}

/// The registered instances of `service` (gone ones too: their failures
/// are still in their databases).
fn service_targets(conn: &Connection, service: &str) -> rusqlite::Result<Vec<Target>> {
    let mut statement = conn.prepare(
        "SELECT instance_id, base_url, diagnostics_token FROM instances \
         WHERE service = ?1 ORDER BY base_url",
    )?;
    statement.query_map([service], Target::of_row)?.collect()
}

/// GETs `{base_url}{path}` with the instance's token; its JSON, at most
/// [`MAX_FAILED_BYTES`].
async fn ask<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    target: &Target,
    path: &str,
    query: &[(&str, &str)],
) -> Result<T, String> {
    let mut request = client
        .get(format!("{}{path}", target.base_url))
        .query(query);
    if let Some(token) = &target.token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!(
            "{path} answered HTTP {}",
            response.status().as_u16()
        ));
    }
    let body = aggregator::read_bounded(response, MAX_FAILED_BYTES)
        .await
        .map_err(|error| match error {
            BoundedRead::TooLarge => format!("{path} answered over {MAX_FAILED_BYTES} bytes"),
            BoundedRead::Failed(why) => why,
        })?;
    serde_json::from_slice(&body).map_err(|e| format!("{path} answered other JSON: {e}"))
}

fn recent_actions(conn: &Connection, service: &str) -> rusqlite::Result<Vec<ActionRow>> {
    let mut statement = conn.prepare(
        "SELECT at, action, instance_id, destination, error_code, outcome \
         FROM operator_actions WHERE service = ?1 ORDER BY id DESC LIMIT ?2",
    )?;
    statement
        .query_map(params![service, SHOWN_ACTIONS], |row| {
            Ok(ActionRow {
                at: crate::store::rfc3339(row.get(0)?),
                action: row.get(1)?,
                instance_id: row.get(2)?,
                destination: row.get(3)?,
                error_code: row.get(4)?,
                outcome: row.get(5)?,
            })
        })?
        .collect()
}

/// `GET /services/{service}/failures`: for the operator (a session, or
/// the operator token as for the failed list); without either, 303 to the
/// sign-in page. 400 `bad_request` for a service id that is not one or
/// any query; 404 `not_found` when no instance of it is registered.
pub(crate) async fn serve_page(
    State(shared): State<Arc<Shared>>,
    UrlPath(service): UrlPath<String>,
    headers: HeaderMap,
    query: Result<Query<NoQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let session = session::valid_session(&shared, &headers, now_ms());
    let sign_in_url = format!("/dashboard/sign-in?next=/services/{service}/failures");
    if session.is_none() {
        if headers.get(header::AUTHORIZATION).is_none() && shared.credentials.operator.is_some() {
            crate::directory::check_service(&service)?;
            return Ok(see_other(&sign_in_url));
        }
        authorize(&shared, &headers, crate::access::Access::Operator)?;
    }
    query.map_err(|e| {
        ApiError::BadRequest(format!("{}; this page takes no query", e.body_text()))
    })?;
    crate::directory::check_service(&service)?;
    let name = service.clone();
    let (targets, actions) = with_db(&shared, move |conn| {
        Ok((service_targets(conn, &name)?, recent_actions(conn, &name)?))
    })
    .await?;
    if targets.is_empty() {
        return Err(ApiError::NotFound(format!(
            "no instance of service `{service}` is registered"
        )));
    }
    let client = crate::access::instance_client(aggregator::MAX_TIMEOUT, &shared.networks)?;
    let mut asks = tokio::task::JoinSet::new();
    for (index, target) in targets.into_iter().enumerate() {
        let client = client.clone();
        asks.spawn(async move {
            let answer: Result<RemoteGroups, String> =
                ask(&client, &target, "/_rf/outbox/failed/groups", &[]).await;
            (index, target, answer)
        });
    }
    let mut instances = Vec::new();
    while let Some(joined) = asks.join_next().await {
        let Ok((index, target, answer)) = joined else {
            continue;
        };
        let (problem, groups) = match answer {
            Ok(list) => (None, list.groups),
            Err(why) => (Some(why), Vec::new()),
        };
        instances.push((
            index,
            InstanceFailures {
                instance_id: target.instance_id,
                base_url: target.base_url,
                problem,
                groups,
            },
        ));
    }
    instances.sort_by_key(|(index, _)| *index);
    html_page(&FailuresPage {
        csrf: session.map(|s| shared.session_key.form_token(&s)),
        service,
        instances: instances.into_iter().map(|(_, i)| i).collect(),
        actions,
        sign_in_url,
    })
}

/// The form of a retry or discard: one group of one instance.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ActionForm {
    csrf: Option<String>,
    instance: String,
    destination: String,
    error: String,
}

/// Retry or discard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Retry,
    Discard,
}

impl Action {
    fn parse(text: &str) -> Result<Self, ApiError> {
        match text {
            "retry" => Ok(Action::Retry),
            "discard" => Ok(Action::Discard),
            other => Err(ApiError::NotFound(format!(
                "no action `{other}`: the failures page has retry and discard"
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Discard => "discard",
        }
    }
}

/// A destination or error code of a form: 1 to [`MAX_FIELD_CHARS`]
/// characters, none of them a control character.
fn check_field(name: &str, value: &str) -> Result<(), ApiError> {
    let count = value.chars().count();
    if (1..=MAX_FIELD_CHARS).contains(&count) && !value.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "`{name}` must be 1 to {MAX_FIELD_CHARS} characters without control characters"
        )))
    }
}

/// One message of the failed list: what an action needs of it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedMessage {
    message_id: String,
    destination: String,
    #[serde(default)]
    last_error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedPage {
    messages: Vec<ListedMessage>,
    #[serde(default)]
    next_cursor: Option<String>,
}

/// The ids of the group's messages (at most [`MAX_ACTION_MESSAGES`]), and
/// whether there are more.
async fn group_ids(
    client: &reqwest::Client,
    target: &Target,
    destination: &str,
    error_code: &str,
) -> Result<(Vec<String>, bool), String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("destination", destination), ("limit", "1000")];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor));
        }
        let page: ListedPage = ask(client, target, "/_rf/outbox/failed", &query).await?;
        for message in page.messages {
            if message.destination == destination
                && rfidl_runtime::diagnostics::error_code(message.last_error.as_deref())
                    == error_code
            {
                if ids.len() == MAX_ACTION_MESSAGES {
                    return Ok((ids, true));
                }
                ids.push(message.message_id);
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok((ids, false)),
        }
    }
}

/// Retries or discards each of `ids`: how many the instance did, how many
/// it refused (moved on meanwhile), and why it stopped early, if it did.
async fn act(
    client: &reqwest::Client,
    target: &Target,
    action: Action,
    ids: &[String],
) -> (usize, usize, Option<String>) {
    let (mut done, mut refused) = (0, 0);
    for id in ids {
        let mut request = client.post(format!(
            "{}/_rf/outbox/{id}/{}",
            target.base_url,
            action.as_str()
        ));
        if let Some(token) = &target.token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => done += 1,
            Ok(response) if response.status().is_client_error() => refused += 1,
            Ok(response) => {
                let why = format!("HTTP {} on message {id}", response.status().as_u16());
                return (done, refused, Some(why));
            }
            Err(error) => return (done, refused, Some(error.to_string())),
        }
    }
    (done, refused, None)
}

/// `POST /services/{service}/failures/{retry|discard}` (form: `csrf`,
/// `instance`, `destination`, `error`). Checks, in order: 403
/// `operation_disabled`, 401 `unauthorized` (no session, no bearer
/// operator token), 403 `csrf_mismatch`, 400 `bad_request` (a form of
/// other fields, an empty or overlong destination or error, a service id
/// that is not one), 404 `not_found` (an action other than the two), 404
/// `unknown_instance` (not an instance of this service); then 502
/// `instance_unreachable` when the instance's list cannot be read. Else
/// 303 back to the page.
pub(crate) async fn serve_action(
    State(shared): State<Arc<Shared>>,
    UrlPath((service, action)): UrlPath<(String, String)>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ApiError> {
    let form_token = match &form {
        Ok(Form(form)) => form.csrf.clone(),
        Err(_) => None,
    };
    let actor = match session::authorize_action(&shared, &headers, form_token.as_deref(), now_ms())
    {
        // A malformed form cannot carry its token: say what is wrong
        // with it rather than that the token is missing.
        Err(ApiError::CsrfMismatch(_)) if form.is_err() => Actor::Session,
        other => other?,
    };
    let Form(form) = form.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; the form has `csrf`, `instance`, `destination` and `error`",
            e.body_text()
        ))
    })?;
    let action = Action::parse(&action)?;
    crate::directory::check_service(&service)?;
    check_field("destination", &form.destination)?;
    check_field("error", &form.error)?;
    let (name, id) = (service.clone(), form.instance.clone());
    let target = with_db(&shared, move |conn| {
        Ok(service_targets(conn, &name)?
            .into_iter()
            .find(|t| t.instance_id == id))
    })
    .await?
    .ok_or_else(|| {
        ApiError::UnknownInstance(format!(
            "`{}` is not a registered instance of service `{service}`",
            form.instance
        ))
    })?;
    let client = crate::access::instance_client(aggregator::MAX_TIMEOUT, &shared.networks)?;
    let listed = group_ids(&client, &target, &form.destination, &form.error).await;
    let (outcome, done, refused, failure) = match &listed {
        Err(why) => (
            format!("not done: the instance's failed list could not be read ({why})"),
            0,
            0,
            Some(why.clone()),
        ),
        Ok((ids, more)) => {
            let (done, refused, stopped) = act(&client, &target, action, ids).await;
            let mut outcome = format!("{done} of {} message(s) {}", ids.len(), past(action));
            if refused > 0 {
                outcome.push_str(&format!(", {refused} refused (no longer failed)"));
            }
            if let Some(why) = &stopped {
                outcome.push_str(&format!(", stopped: {why}"));
            }
            if *more {
                outcome.push_str(&format!(
                    "; more than {MAX_ACTION_MESSAGES} in the group: press again for the rest"
                ));
            }
            (outcome, done, refused, stopped)
        }
    };
    tracing::info!(
        actor = actor.as_str(),
        %service,
        instance = %target.instance_id,
        base_url = %target.base_url,
        action = action.as_str(),
        destination = %form.destination,
        error_code = %form.error,
        done,
        refused,
        outcome = %outcome,
        "operator action from the dashboard"
    );
    let record = ActionRecord {
        service: service.clone(),
        instance_id: target.instance_id.clone(),
        action,
        destination: form.destination.clone(),
        error_code: form.error.clone(),
        done,
        refused,
        outcome,
    };
    with_db(&shared, move |conn| Ok(record.store(conn, now_ms())?)).await?;
    if let (Err(_), Some(why)) = (&listed, failure) {
        return Err(ApiError::InstanceUnreachable(format!(
            "{}: {why}",
            target.base_url
        )));
    }
    Ok(see_other(&format!("/services/{service}/failures")))
}

fn past(action: Action) -> &'static str {
    match action {
        Action::Retry => "retried",
        Action::Discard => "discarded",
    }
}

/// One row of `operator_actions`.
struct ActionRecord {
    service: String,
    instance_id: String,
    action: Action,
    destination: String,
    error_code: String,
    done: usize,
    refused: usize,
    outcome: String,
}

impl ActionRecord {
    /// Stores it and keeps the service's latest [`KEPT_ACTIONS`].
    fn store(&self, conn: &Connection, now_ms: i64) -> rusqlite::Result<()> {
        conn.execute(
            "INSERT INTO operator_actions (at, service, instance_id, action, destination, \
             error_code, done, refused, outcome) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                now_ms,
                self.service,
                self.instance_id,
                self.action.as_str(),
                self.destination,
                self.error_code,
                self.done as i64,
                self.refused as i64,
                self.outcome
            ],
        )?;
        let oldest_kept: Option<i64> = conn
            .query_row(
                "SELECT id FROM operator_actions WHERE service = ?1 \
                 ORDER BY id DESC LIMIT 1 OFFSET ?2 - 1",
                params![self.service, KEPT_ACTIONS],
                |row| row.get(0),
            )
            .optional()?;
        if let Some(id) = oldest_kept {
            conn.execute(
                "DELETE FROM operator_actions WHERE service = ?1 AND id < ?2",
                params![self.service, id],
            )?;
        }
        Ok(())
    }
}
