//! One receiver hosts `EmpService v1` and `v2` side by side through the
//! generated receivers. A payload that does not fit the hosted version is
//! refused with 422 (never mis-decoded); a compatible revision of the same
//! version with another fingerprint is accepted and counted.

#![allow(deprecated)] // v1 is deprecated in the contract; served here on purpose

use rfidl_e2e::contracts::common::Channel;
use rfidl_e2e::contracts::hr::employees::{
    Employee, HireAck, OrgUnit, emp_service_v1, emp_service_v2,
};
use rfidl_runtime::receiver::{HandlerError, IncomingCall, Receiver};
use rfidl_runtime::rusqlite::Transaction;
use rfidl_runtime::signing::{Secret, SignatureHeaders, unix_now};
use rfidl_runtime::types::{Duration, Timestamp, Uuid};
use serde_json::json;

struct Engine;

impl Engine {
    fn record(
        tx: &Transaction<'_>,
        employee: &Employee,
        version: u32,
    ) -> Result<HireAck, HandlerError> {
        tx.execute(
            "INSERT INTO hires (employee_id, version) VALUES (?1, ?2)",
            rfidl_runtime::rusqlite::params![employee.id.to_string(), version],
        )?;
        Ok(HireAck {
            workflow_id: employee.id,
        })
    }
}

impl emp_service_v1::EngineHandler for Engine {
    fn employee_hired(
        &self,
        _: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee: Employee,
    ) -> Result<HireAck, HandlerError> {
        Self::record(tx, &employee, 1)
    }
    fn onboarding_completed(
        &self,
        _: &IncomingCall<'_>,
        _: &Transaction<'_>,
        _: Uuid,
        _: Timestamp,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl emp_service_v2::EngineHandler for Engine {
    fn employee_hired(
        &self,
        _: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        employee: Employee,
        _: Channel,
        _: Option<String>,
    ) -> Result<HireAck, HandlerError> {
        Self::record(tx, &employee, 2)
    }
    fn onboarding_completed(
        &self,
        _: &IncomingCall<'_>,
        _: &Transaction<'_>,
        _: Uuid,
        _: Timestamp,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
    fn leave_started(
        &self,
        _: &IncomingCall<'_>,
        _: &Transaction<'_>,
        _: Uuid,
        _: Duration,
        _: Option<String>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
    fn org_chart_changed(
        &self,
        _: &IncomingCall<'_>,
        _: &Transaction<'_>,
        _: OrgUnit,
        _: u32,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn employee() -> serde_json::Value {
    json!({
        "id": Uuid::now_v7(), "name": "Ada", "hired_on": "2026-11-23",
        "salary": {"amount": "5200.00", "currency": "EUR"}, "tags": [], "attributes": {},
        "status": "Active", "weekly_hours": 38.5
    })
}

#[tokio::test]
async fn v1_and_v2_side_by_side_with_strict_decoding_and_tolerant_fingerprints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("engine.db");
    let secret = Secret::generate();
    rfidl_runtime::store::sqlite::open(&db, rfidl_runtime::Durability::Full)
        .expect("open")
        .execute_batch("CREATE TABLE hires (employee_id TEXT, version INTEGER)")
        .expect("table");
    let config = rfidl_runtime::Config::default().with_peer("hr", secret.to_whsec());
    let receiver = Receiver::builder(config, &db)
        .service(emp_service_v1::EngineReceiver(Engine))
        .service(emp_service_v2::EngineReceiver(Engine))
        .build()
        .expect("receiver");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "http://{}/_rf/receive",
        listener.local_addr().expect("addr")
    );
    let router = receiver.router();
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    let client = reqwest::Client::new();
    let post = |version: u32, fingerprint: &str, payload: serde_json::Value| {
        let id = Uuid::now_v7().to_string();
        let body = serde_json::to_vec(&json!({
            "messageId": id, "sourceServiceId": "hr", "messageType": "PushCall",
            "interface": "hr.employees.EmpService", "version": version, "fingerprint": fingerprint,
            "endpoint": "EmployeeHired", "payload": payload,
        }))
        .expect("json");
        let headers = SignatureHeaders::sign(&id, unix_now(), &body, std::slice::from_ref(&secret));
        let mut request = client.post(&url);
        for (name, value) in headers.to_pairs() {
            request = request.header(name, value);
        }
        async move {
            let response = request.body(body).send().await.expect("send");
            let status = response.status().as_u16();
            (
                status,
                response
                    .json::<serde_json::Value>()
                    .await
                    .unwrap_or_default(),
            )
        }
    };

    // Each version decodes its own shape.
    assert_eq!(
        post(
            1,
            emp_service_v1::FINGERPRINT,
            json!({"employee": employee()})
        )
        .await
        .0,
        200
    );
    let v2 = json!({"employee": employee(), "channel": "Web"});
    assert_eq!(post(2, emp_service_v2::FINGERPRINT, v2).await.0, 200);
    // A v1 payload sent as v2 lacks the required `channel`: refused, not mis-decoded.
    let (status, answer) = post(
        2,
        emp_service_v2::FINGERPRINT,
        json!({"employee": employee()}),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (422, Some("payload_mismatch")),
        "{answer}"
    );
    // A compatible revision of v2 (another fingerprint, one more optional member) is accepted and counted.
    let revised = json!({"employee": employee(), "channel": "Api", "campaign": "spring"});
    assert_eq!(
        post(2, "sha256:a-compatible-revision", revised).await.0,
        200
    );
    assert_eq!(receiver.metrics().inbox_fingerprint_mismatches.get(), 1);
    let versions: Vec<i64> = rfidl_runtime::rusqlite::Connection::open(&db)
        .expect("open")
        .prepare("SELECT version FROM hires ORDER BY rowid")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(versions, [1, 2, 2], "the refused message left nothing");
}
