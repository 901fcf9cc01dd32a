//! The receiver's pipeline for admitted bodies: the wire's order of checks
//! (signature count, envelope, source, signature, fields, route; large
//! bodies on the blocking pool), the inbox look-up, the hand-off to the
//! writer and its answers, the dedup horizon and the counting of every
//! answer. It never writes to the database itself: the writer does, in the
//! handler's transaction.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderMap;
use tokio::sync::oneshot;
use tracing::{debug, error, warn};
use uuid::Uuid;

use super::writer::{Command, Delivery, Job};
use super::{
    ADMIT_INLINE_LIMIT, BatchAdmission, ReceiveError, Reply, Shared, Stored, Verification, handler,
};
use crate::envelope::{BatchItem, Envelope};
use crate::inbox::payload_digest;
use crate::signing::{self, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};

impl Shared {
    pub(super) async fn receive_one(self: &Arc<Self>, headers: &HeaderMap, body: Bytes) -> Reply {
        self.receive_one_at(headers, body, signing::unix_now())
            .await
    }

    /// [`receive_one`](Self::receive_one) with the signature's timestamp
    /// checked against `now` (Unix seconds).
    pub(super) async fn receive_one_at(
        self: &Arc<Self>,
        headers: &HeaderMap,
        body: Bytes,
        now: i64,
    ) -> Reply {
        let admitted = if body.len() <= ADMIT_INLINE_LIMIT {
            self.admit(headers, &body, now)
        } else {
            let shared = Arc::clone(self);
            let headers = headers.clone();
            tokio::task::spawn_blocking(move || shared.admit(&headers, &body, now))
                .await
                .unwrap_or_else(|e| {
                    Err(ReceiveError::Unavailable(format!(
                        "the admission task failed: {e}"
                    )))
                })
        };
        let answer = match admitted {
            Ok(admitted) => {
                let mut answers = self.process(vec![admitted], LookUp::First).await;
                answers
                    .pop()
                    .unwrap_or(Reply::Refused(ReceiveError::Unavailable(
                        "the writer gave no answer".to_owned(),
                    )))
            }
            Err(refusal) => Reply::Refused(refusal),
        };
        self.count(&answer);
        answer
    }

    /// A batch request's body: a JSON array of items, each admitted on its
    /// own, the admitted ones processed together.
    pub(super) async fn receive_batch(
        self: &Arc<Self>,
        bytes: Bytes,
    ) -> Result<Vec<Reply>, ReceiveError> {
        let admission = if bytes.len() <= ADMIT_INLINE_LIMIT {
            self.admit_batch(&bytes)?
        } else {
            let shared = Arc::clone(self);
            tokio::task::spawn_blocking(move || shared.admit_batch(&bytes))
                .await
                .map_err(|e| {
                    ReceiveError::Unavailable(format!("the admission task failed: {e}"))
                })??
        };
        Ok(self.answer_all(admission, LookUp::First).await)
    }

    /// Several messages a broker consumer took, each stored at its own
    /// time (Unix seconds: what its signature's timestamp is checked
    /// against), each admitted on its own, the admitted ones processed
    /// together (one writer job, as a batch request's), and looked up in
    /// the committed inbox only by the writer: a broker delivers a message
    /// again only after a lost acknowledgement or a crash.
    pub(super) async fn receive_many_at(self: &Arc<Self>, messages: Vec<Stored>) -> Vec<Reply> {
        let bytes: usize = messages.iter().map(|m| m.body.len()).sum();
        let admission = if bytes <= ADMIT_INLINE_LIMIT {
            self.admit_stored(&messages)
        } else {
            let count = messages.len();
            let shared = Arc::clone(self);
            match tokio::task::spawn_blocking(move || shared.admit_stored(&messages)).await {
                Ok(admission) => admission,
                Err(e) => {
                    let refusal =
                        ReceiveError::Unavailable(format!("the admission task failed: {e}"));
                    (
                        vec![Some(Reply::Refused(refusal)); count],
                        Vec::new(),
                        Vec::new(),
                    )
                }
            }
        };
        self.answer_all(admission, LookUp::InWriter).await
    }

    /// [`admit`](Self::admit)s each stored message.
    fn admit_stored(&self, messages: &[Stored]) -> BatchAdmission {
        self.admit_each(
            messages
                .iter()
                .map(|message| (&message.headers, &message.body[..], message.stored_at)),
        )
    }

    /// [`admit`](Self::admit)s each of `messages` (headers, body, the time
    /// its signature is checked against), refusing a body over the limit:
    /// an answer for each refused one, the admitted deliveries, and their
    /// positions.
    fn admit_each<'m, H: SignatureHeaderSource + 'm>(
        &self,
        messages: impl ExactSizeIterator<Item = (&'m H, &'m [u8], i64)>,
    ) -> BatchAdmission {
        let mut answers: Vec<Option<Reply>> = Vec::with_capacity(messages.len());
        let mut admitted = Vec::new();
        let mut positions = Vec::new();
        for (headers, body, now) in messages {
            let admission = if body.len() > self.body_limit {
                Err(ReceiveError::PayloadTooLarge {
                    limit: self.body_limit,
                })
            } else {
                self.admit(headers, body, now)
            };
            match admission {
                Ok(delivery) => {
                    positions.push(answers.len());
                    answers.push(None);
                    admitted.push(delivery);
                }
                Err(refusal) => answers.push(Some(Reply::Refused(refusal))),
            }
        }
        (answers, admitted, positions)
    }

    /// Processes the admitted deliveries of a batch together: one answer
    /// per item, in order, each counted.
    async fn answer_all(
        &self,
        (mut answers, admitted, positions): BatchAdmission,
        look_up: LookUp,
    ) -> Vec<Reply> {
        if !admitted.is_empty() {
            let processed = self.process(admitted, look_up).await;
            for (position, answer) in positions.into_iter().zip(processed) {
                answers[position] = Some(answer);
            }
        }
        let answers: Vec<Reply> = answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or(Reply::Refused(ReceiveError::Unavailable(
                    "the writer gave no answer".to_owned(),
                )))
            })
            .collect();
        for answer in &answers {
            self.count(answer);
        }
        answers
    }

    /// Parses a batch and [`admit`](Self::admit)s each item: an answer for
    /// each refused one, the admitted deliveries, and their positions.
    pub(super) fn admit_batch(&self, bytes: &[u8]) -> Result<BatchAdmission, ReceiveError> {
        let items: Vec<BatchItem> = serde_json::from_slice(bytes).map_err(|e| {
            ReceiveError::MalformedEnvelope(format!(
                "a batch is a JSON array of {{\"headers\": {{…}}, \"body\": \"<envelope JSON>\"}}: {}",
                crate::redact::json_error(&e)
            ))
        })?;
        Ok(self.admit_each(
            items
                .iter()
                .map(|item| (&item.headers, item.body.as_bytes(), signing::unix_now())),
        ))
    }

    /// Steps 2 to 6 of the order of checks: envelope, source, signature,
    /// fields, route. Pure CPU work; nothing is read or written.
    fn admit(
        &self,
        headers: &impl SignatureHeaderSource,
        body: &[u8],
        now: i64,
    ) -> Result<Delivery, ReceiveError> {
        let header = |name: &'static str| headers.header(name);
        // 1b. A bounded number of signatures, before any work on the body
        //    (a thousand entries would otherwise cost a thousand HMACs).
        if self.verification == Verification::Required {
            signing::check_signature_count(header(HEADER_SIGNATURE))
                .map_err(ReceiveError::Signature)?;
        }
        // 2. A JSON object with a string `sourceServiceId` (read unverified,
        //    only to choose the secret set).
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| ReceiveError::MalformedEnvelope(format!("body is not JSON: {e}")))?;
        let serde_json::Value::Object(members) = &value else {
            return Err(ReceiveError::MalformedEnvelope(format!(
                "the envelope must be a JSON object, found {}",
                handler::json_kind(&value)
            )));
        };
        let Some(source) = members.get("sourceServiceId").and_then(|v| v.as_str()) else {
            return Err(ReceiveError::MalformedEnvelope(
                "`sourceServiceId` is missing or not a string".to_owned(),
            ));
        };

        // 3 and 4. Source known, signature valid.
        if self.verification == Verification::Required {
            // Configured secrets first; else the issued ones (a snapshot:
            // one read lock and an `Arc` clone).
            let snapshot;
            let secrets = match self.secrets.get(source) {
                Some(secrets) => secrets.as_slice(),
                None => {
                    let Some(issued) = &self.issued else {
                        return Err(ReceiveError::UnknownSource(source.to_owned()));
                    };
                    snapshot = issued.snapshot();
                    let Some(secrets) = snapshot.peers.get(source) else {
                        // A peer that registered after our last renewal:
                        // renew now; the sender retries without counting.
                        issued.request_refresh();
                        return Err(ReceiveError::KeysPending(source.to_owned()));
                    };
                    secrets.as_slice()
                }
            };
            signing::verify(
                header(HEADER_ID),
                header(HEADER_TIMESTAMP),
                header(HEADER_SIGNATURE),
                body,
                secrets,
                now,
                self.tolerance,
            )
            .map_err(ReceiveError::Signature)?;
        }

        // 5. Envelope fields, and webhook-id = messageId.
        let raw_message_id = members
            .get("messageId")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let envelope: Envelope = serde_json::from_value(value)
            .map_err(|e| ReceiveError::MalformedEnvelope(crate::redact::json_error(&e)))?;
        if !envelope.payload.is_object() {
            return Err(ReceiveError::MalformedEnvelope(format!(
                "`payload` must be a JSON object, found {}",
                handler::json_kind(&envelope.payload)
            )));
        }
        let raw_message_id = raw_message_id.unwrap_or_default();
        match header(HEADER_ID) {
            Some(id) if id != raw_message_id => {
                return Err(ReceiveError::IdMismatch {
                    header: id.to_owned(),
                    body: raw_message_id,
                });
            }
            _ => {}
        }

        // 6. A hosted interface, version and endpoint.
        let Some(versions) = self.routes.get(envelope.interface.as_str()) else {
            return Err(ReceiveError::UnknownInterface(envelope.interface));
        };
        let Some(route) = versions.get(&envelope.version) else {
            let hosted = versions
                .keys()
                .map(|v| format!("v{v}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ReceiveError::UnknownVersion {
                interface: envelope.interface,
                version: envelope.version,
                hosted,
            });
        };
        if !route.hosted.endpoints.contains(&envelope.endpoint.as_str()) {
            return Err(ReceiveError::UnknownEndpoint {
                interface: envelope.interface,
                version: envelope.version,
                endpoint: envelope.endpoint,
            });
        }
        if let Some(lifecycle) = &self.lifecycle
            && lifecycle.is_decommissioned(&envelope.interface, envelope.version)
        {
            return Err(ReceiveError::VersionDecommissioned {
                interface: envelope.interface,
                version: envelope.version,
            });
        }
        let hosted_fingerprint_differs =
            (envelope.fingerprint != route.hosted.fingerprint).then_some(route.hosted.fingerprint);
        let message_id = canonical_id(envelope.message_id);
        let (trace, carried) = crate::trace::received(&envelope.headers);
        let span = tracing::info_span!(
            "receive",
            message_id = %message_id,
            source = %envelope.source_service_id,
            interface = %envelope.interface,
            version = envelope.version,
            endpoint = %envelope.endpoint,
            trace_id = %trace.trace_id(),
            parent_id = %crate::trace::OptionalId(carried.map(|t| t.parent_id())),
        );
        Ok(Delivery {
            trace,
            span,
            message_id,
            payload_sha256: payload_digest(&envelope.payload),
            service: route.service,
            hosted_fingerprint_differs,
            envelope,
        })
    }

    /// Step 7 (the committed-inbox look-up, off the executor), then the
    /// writer for whatever is new (steps 8 and 9 run there).
    pub(super) async fn process(&self, admitted: Vec<Delivery>, look_up: LookUp) -> Vec<Reply> {
        let keys: Vec<(String, String)> = admitted
            .iter()
            .map(|a| (a.envelope.source_service_id.clone(), a.message_id.clone()))
            .collect();
        // A lone message within the dedup horizon goes straight to the
        // writer, unread: the writer's transaction looks it up anyway and
        // answers a duplicate from there, so a look-up here would only put a
        // read (and, on SQLite, a page cache the writer's last commit made
        // stale) on every message's path (measured in BENCHMARKS.md,
        // "Commit -> effect"). So do a broker's deliveries
        // ([`LookUp::InWriter`]). Batches, and a message whose age makes the
        // look-up decide between a duplicate and `beyond_dedup_horizon`,
        // are looked up here on the blocking pool, which keeps duplicates
        // off the writer.
        let within_horizon = || admitted.iter().all(|a| self.beyond_horizon(a).is_none());
        let straight = (admitted.len() == 1 || look_up == LookUp::InWriter) && within_horizon();
        let found = match straight {
            true => Ok(admitted.iter().map(|_| Ok(None)).collect()),
            false => {
                let reader = Arc::clone(&self.reader);
                let keys = keys.clone();
                tokio::task::spawn_blocking(move || {
                    keys.iter()
                        .map(|(source, id)| reader.lookup(source, id))
                        .collect::<Vec<_>>()
                })
                .await
            }
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                error!(error = %e, "inbox look-up task failed");
                let refusal = ReceiveError::Unavailable("inbox look-up failed".to_owned());
                return vec![Reply::Refused(refusal); admitted.len()];
            }
        };

        let mut answers: Vec<Option<Reply>> = Vec::with_capacity(admitted.len());
        let mut fresh = Vec::new();
        let mut positions = Vec::new();
        for (delivery, entry) in admitted.into_iter().zip(found) {
            match entry {
                Ok(Some(entry)) if entry.payload_sha256 == delivery.payload_sha256 => {
                    self.metrics.inbox_duplicates.inc();
                    answers.push(Some(Reply::Acknowledged {
                        duplicate: true,
                        payload: entry.response_value(),
                    }));
                }
                Ok(Some(_)) => {
                    answers.push(Some(Reply::Refused(ReceiveError::MessageIdReused {
                        source_service_id: delivery.envelope.source_service_id.clone(),
                        message_id: delivery.message_id.clone(),
                    })));
                }
                Ok(None) => {
                    if let Some(refusal) = self.beyond_horizon(&delivery) {
                        answers.push(Some(Reply::Refused(refusal)));
                        continue;
                    }
                    positions.push(answers.len());
                    answers.push(None);
                    fresh.push(delivery);
                }
                Err(e) => {
                    error!(error = %e, "inbox look-up failed");
                    answers.push(Some(Reply::Refused(ReceiveError::Unavailable(format!(
                        "inbox look-up failed: {e}"
                    )))));
                }
            }
        }

        if !fresh.is_empty() {
            let count = fresh.len();
            let written = self.write(fresh).await;
            let written = if written.len() == count {
                written
            } else {
                vec![
                    Reply::Refused(ReceiveError::Unavailable(
                        "the writer gave no answer".to_owned()
                    ));
                    count
                ]
            };
            for (position, answer) in positions.into_iter().zip(written) {
                answers[position] = Some(answer);
            }
        }
        answers
            .into_iter()
            .zip(keys)
            .map(|(answer, (source, id))| {
                let answer = answer.unwrap_or(Reply::Refused(ReceiveError::Unavailable(
                    "no answer".to_owned(),
                )));
                if matches!(
                    answer,
                    Reply::Acknowledged {
                        duplicate: true,
                        ..
                    }
                ) {
                    self.duplicates.note(&source, &id);
                }
                answer
            })
            .collect()
    }

    /// The dedup horizon: a message with no inbox record, created longer
    /// ago than the inbox keeps records, may have been processed and
    /// forgotten. It is refused rather than processed a second time.
    pub(super) fn beyond_horizon(&self, delivery: &Delivery) -> Option<ReceiveError> {
        let created = delivery.envelope.created_at?;
        let age_ms = jiff::Timestamp::now()
            .as_millisecond()
            .saturating_sub(created.as_millisecond());
        let horizon_ms = self.dedup_horizon.as_millis() as i64;
        (age_ms > horizon_ms).then(|| ReceiveError::BeyondDedupHorizon {
            message_id: delivery.message_id.clone(),
            age_secs: (age_ms / 1000).max(0) as u64,
            horizon_secs: (horizon_ms / 1000) as u64,
        })
    }

    /// Hands deliveries to the writer and waits (bounded) for their answers.
    pub(super) async fn write(&self, deliveries: Vec<Delivery>) -> Vec<Reply> {
        let count = deliveries.len();
        let (reply, answered) = oneshot::channel();
        let job = Job { deliveries, reply };
        let wait = async {
            if self.commands.send(Command::Deliver(job)).await.is_err() {
                return vec![Reply::Refused(ReceiveError::ShuttingDown); count];
            }
            answered
                .await
                .unwrap_or_else(|_| vec![Reply::Refused(ReceiveError::ShuttingDown); count])
        };
        match tokio::time::timeout(self.in_progress_wait, wait).await {
            Ok(answers) => answers,
            // The writer may still commit it: the sender's retry then gets a duplicate.
            Err(_) => vec![Reply::Refused(ReceiveError::InProgress); count],
        }
    }

    /// Counts a refusal and logs it: 401s at `warn` (a peer's secret may be
    /// wrong or rotating), other refusals at `debug`.
    pub(super) fn count_refusal(&self, refusal: &ReceiveError) {
        let status = refusal.status();
        if status == axum::http::StatusCode::UNAUTHORIZED {
            self.metrics.inbox_signature_failures.inc();
            warn!(code = refusal.code(), "delivery refused: {refusal}");
        } else {
            if status.is_client_error() {
                self.metrics.inbox_rejected.inc();
            }
            debug!(
                status = status.as_u16(),
                code = refusal.code(),
                "delivery refused: {refusal}"
            );
        }
    }

    pub(super) fn count(&self, answer: &Reply) {
        if let Reply::Refused(refusal) = answer {
            self.count_refusal(refusal);
        }
    }
}

/// Where a batch's messages are looked up in the committed inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LookUp {
    /// First, on the blocking pool (a lone message within the dedup
    /// horizon excepted): a batch sent again whole, after its answer was
    /// lost, is answered without the writer.
    First,
    /// Only in the writer's transaction, whose claim answers a duplicate.
    InWriter,
}

/// Where the `webhook-*` headers of a message are read from: the request's
/// headers, or a batch item's `headers` map (names compared without case).
trait SignatureHeaderSource {
    fn header(&self, name: &str) -> Option<&str>;
}

impl SignatureHeaderSource for HeaderMap {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

impl SignatureHeaderSource for BTreeMap<String, String> {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// The inbox key of a message id: lower-case, hyphenated.
fn canonical_id(id: Uuid) -> String {
    id.hyphenated().to_string()
}
