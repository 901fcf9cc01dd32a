//! The HTTP handlers of the directory: register, heartbeat, deregister
//! (operator), list, deploy check. Each checks its credential, the path's
//! service id and its bounded body ([`REGISTRATION_LIMIT`],
//! [`HEARTBEAT_LIMIT`]) before it reaches the database, and sends the
//! `Decommission` commands a new provider of a retired version needs.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rusqlite::params;

use super::{
    DeployCheck, HEARTBEAT_LIMIT, Heartbeat, Owner, REGISTRATION_LIMIT, Registration, heartbeat,
    register, scan, services,
};
use crate::access::Access;
use crate::{ApiError, Shared, authorize, conditional, now_ms, with_db};

/// A service id: 1 to 128 of `A-Z a-z 0-9 . _ -`.
pub(crate) fn check_service(service: &str) -> Result<(), ApiError> {
    let ok = !service.is_empty()
        && service.len() <= 128
        && service
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "`{service}` is not a service id (1 to 128 of A-Z a-z 0-9 . _ -)"
        )))
    }
}

/// `http://host:port[/path]` without query or fragment, trailing `/` dropped.
fn normalise_base_url(text: &str) -> Result<String, ApiError> {
    let invalid = |why: &str| ApiError::InvalidRegistration(format!("baseUrl `{text}` {why}"));
    let url = reqwest::Url::parse(text).map_err(|e| invalid(&format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("is not http:// or https://"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(invalid("must not have a query, fragment or user name"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

async fn json_body<T: serde::de::DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let body: Bytes = crate::read_body(body, REGISTRATION_LIMIT).await?;
    serde_json::from_slice(&body).map_err(|e| ApiError::InvalidRegistration(e.to_string()))
}

/// `POST /v1/services/{service}/instances`: registers (or renews) an
/// instance; 201 when new, 200 when it was registered already.
pub(crate) async fn serve_register(
    State(shared): State<Arc<Shared>>,
    UrlPath(service): UrlPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let registrant = shared.credentials.registrant(&headers)?;
    check_service(&service)?;
    let registration: Registration = json_body(body).await?;
    let base_url = normalise_base_url(&registration.base_url)?;
    shared.networks.check_base_url(&base_url).await?;
    shared.limiter.take(&service)?;
    if registration
        .diagnostics_token
        .as_deref()
        .is_some_and(str::is_empty)
    {
        return Err(ApiError::InvalidRegistration(
            "diagnosticsToken is empty; leave it out when the service has none".into(),
        ));
    }
    if registration
        .heartbeat_ms
        .is_some_and(|ms| !crate::liveness::HEARTBEAT_MS_RANGE.contains(&ms))
    {
        return Err(ApiError::InvalidRegistration(format!(
            "heartbeatMs must be from {} to {} (milliseconds)",
            crate::liveness::HEARTBEAT_MS_RANGE.start(),
            crate::liveness::HEARTBEAT_MS_RANGE.end()
        )));
    }
    let credentials = shared.credentials.clone();
    let authority = shared.keys.clone();
    let at = shared.liveness.at(now_ms());
    let registered = with_db(&shared, move |conn| {
        let is_live = |owner: &str| credentials.is_live(owner);
        let owner = Owner {
            registrant: &registrant,
            is_live: &is_live,
        };
        // Before anything is stored: another credential's keys are refused.
        if authority.is_some() {
            crate::keys::KeyAuthority::check_owner(conn, &service, &registrant, &is_live)?;
        }
        let mut registered = register(conn, &service, &registration, &base_url, &owner, &at)?;
        if let Some(authority) = &authority {
            registered.keys =
                Some(authority.issue(conn, &service, &registrant, &is_live, at.now_ms)?);
        }
        // Hosted versions that are decommissioned: the new instance is told.
        let mut retired = Vec::new();
        for hosted in &registration.hosts {
            if crate::decommission::decommissioned_at(conn, &hosted.interface, hosted.version)?
                .is_some()
            {
                let generation =
                    crate::decommission::generation(conn, &hosted.interface, hosted.version)?;
                retired.push((hosted.interface.clone(), hosted.version, generation));
            }
        }
        Ok((registered, retired))
    })
    .await?;
    let (registered, retired) = registered;
    if let Some(commands) = &shared.commands {
        let target = crate::commands::Target {
            instance_id: registered.instance_id.clone(),
            base_url: registered.base_url.clone(),
        };
        for (interface, version, generation) in &retired {
            commands
                .send(
                    std::slice::from_ref(&target),
                    interface,
                    *version,
                    *generation,
                    rfidl_runtime::lifecycle::Command::Decommission,
                )
                .await
                .map_err(|e| {
                    ApiError::Unavailable(format!(
                        "registered, but the decommission command for {interface} v{version} \
                         could not be written ({e}); register again"
                    ))
                })?;
        }
    }
    tracing::info!(
        service = %registered.service,
        instance = %registered.instance_id,
        base_url = %registered.base_url,
        created = registered.created,
        "registered"
    );
    let status = if registered.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(registered)).into_response())
}

/// `PUT /v1/services/{service}/instances/{instance}/heartbeat`, with an
/// optional body `{"registrationDigest"}`.
pub(crate) async fn serve_heartbeat(
    State(shared): State<Arc<Shared>>,
    UrlPath((service, instance)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let registrant = shared.credentials.registrant(&headers)?;
    check_service(&service)?;
    let body: Bytes = crate::read_body(body, HEARTBEAT_LIMIT).await?;
    let beat: Heartbeat = if body.iter().all(u8::is_ascii_whitespace) {
        Heartbeat::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::InvalidRegistration(e.to_string()))?
    };
    let at = shared.liveness.at(now_ms());
    let now = at.now_ms;
    let credentials = shared.credentials.clone();
    let authority = shared.keys.clone();
    let (service, instance, keys) = with_db(&shared, move |conn| {
        heartbeat(
            conn,
            &service,
            &instance,
            &registrant,
            beat.registration_digest.as_deref(),
            &at,
        )?;
        // Renewed (and rotated when due) at every heartbeat.
        let keys = match &authority {
            Some(authority) => Some(authority.issue(
                conn,
                &service,
                &registrant,
                &|owner| credentials.is_live(owner),
                now,
            )?),
            None => None,
        };
        Ok((service, instance, keys))
    })
    .await?;
    let mut answer = serde_json::json!({
        "service": service,
        "instanceId": instance,
        "lastSeenAt": crate::store::rfc3339(now),
    });
    if let Some(keys) = keys {
        answer["keys"] = serde_json::to_value(keys)
            .map_err(|e| ApiError::Unavailable(format!("cannot encode the keys: {e}")))?;
    }
    Ok(Json(answer).into_response())
}

/// `DELETE /v1/services/{service}/instances/{instance}`: removes an instance
/// (a service moved or retired) with its interface lists and health
/// history; 204, or 404 `unknown_instance`.
pub(crate) async fn serve_deregister(
    State(shared): State<Arc<Shared>>,
    UrlPath((service, instance)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&shared, &headers, Access::Operator)?;
    check_service(&service)?;
    with_db(&shared, move |conn| {
        let removed = conn.execute(
            "DELETE FROM instances WHERE service = ?1 AND instance_id = ?2",
            params![service, instance],
        )?;
        if removed == 0 {
            return Err(ApiError::UnknownInstance(format!(
                "no instance `{instance}` of service `{service}` is registered"
            )));
        }
        tracing::info!(%service, %instance, "deregistered");
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/services`.
pub(crate) async fn serve_services(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let at = shared.liveness.at(now_ms());
    let services = with_db(&shared, move |conn| Ok(services(conn, &at)?)).await?;
    Ok(conditional::json_response(
        &headers,
        &serde_json::json!({ "services": services }),
    ))
}

/// `POST /v1/deploy-check`: the manifest scan of `calls`, storing nothing.
pub(crate) async fn serve_deploy_check(
    State(shared): State<Arc<Shared>>,
    body: Body,
) -> Result<Response, ApiError> {
    let check: DeployCheck = json_body(body).await?;
    let count = check.calls.len();
    let at = shared.liveness.at(now_ms());
    let unmet = with_db(&shared, move |conn| Ok(scan(conn, &check.calls, &at)?)).await?;
    if !unmet.is_empty() {
        return Err(ApiError::Unsatisfied(unmet));
    }
    Ok(Json(serde_json::json!({"satisfied": true, "checked": count})).into_response())
}
