use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rfidl_e2e::contracts::common::Money;
use rfidl_e2e::contracts::shop::orders::order_service_v1::{
    ServiceClient, ServiceHandler, ServiceReceiver,
};
use rfidl_e2e::contracts::shop::orders::{OrderLine, PaymentReceipt, Reservation, StockLevel};
use rfidl_runtime::config::DestinationConfig;
use rfidl_runtime::dispatcher::Dispatcher;
use rfidl_runtime::outbox::{Outbox, Status};
use rfidl_runtime::receiver::{HandlerError, IncomingCall, Receiver};
use rfidl_runtime::rusqlite::{Transaction, params};
use rfidl_runtime::signing::Secret;
use rfidl_runtime::types::{Decimal, Timestamp, Uuid};
use rfidl_runtime::{Config, rusqlite};

/// The shop's side: reserves stock (one row per reservation, exactly once).
#[derive(Default)]
struct Shop {
    reservations: AtomicU32,
}

impl ServiceHandler for Shop {
    fn reserve_stock(
        &self,
        call: &IncomingCall<'_>,
        tx: &Transaction<'_>,
        order_id: Uuid,
        lines: Vec<OrderLine>,
    ) -> Result<Reservation, HandlerError> {
        self.reservations.fetch_add(1, Ordering::SeqCst);
        let reserved = lines.iter().map(|l| (l.sku.clone(), l.quantity)).collect();
        tx.execute(
            "INSERT INTO reservations (order_id, correlation_id, units) VALUES (?1, ?2, ?3)",
            params![
                order_id.to_string(),
                call.correlation_id,
                lines.iter().map(|l| l.quantity).sum::<u32>()
            ],
        )?;
        Ok(Reservation {
            reservation_id: Uuid::now_v7(),
            reserved,
            expires_at: Timestamp::UNIX_EPOCH,
        })
    }

    fn capture_payment(
        &self,
        _call: &IncomingCall<'_>,
        _tx: &Transaction<'_>,
        _order_id: Uuid,
        amount: Money,
    ) -> Result<PaymentReceipt, HandlerError> {
        Ok(PaymentReceipt {
            payment_id: "pay-1".into(),
            captured: amount,
            gateway_sequence: u64::MAX,
            fee_cents: -30,
        })
    }

    fn check_stock(
        &self,
        _call: &IncomingCall<'_>,
        _tx: &Transaction<'_>,
        sku: String,
    ) -> Result<StockLevel, HandlerError> {
        Ok(if sku.is_empty() {
            StockLevel::OutOfStock
        } else {
            StockLevel::InStock
        })
    }
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row(sql, [], |r| r.get(0)))
        .expect("count")
}

#[tokio::test]
async fn a_command_through_generated_code_is_processed_once_and_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = Secret::generate();

    // The shop: receiver with the generated ServiceReceiver.
    let shop_db = dir.path().join("shop.db");
    let shop_config = Config::for_service("shop").with_peer("engine", secret.to_whsec());
    rfidl_runtime::store::sqlite::open(&shop_db, rfidl_runtime::Durability::Full)
        .expect("open")
        .execute_batch(
            "CREATE TABLE reservations (order_id TEXT, correlation_id TEXT, units INTEGER)",
        )
        .expect("table");
    let shop = Arc::new(Shop::default());
    let receiver = Receiver::builder(shop_config, &shop_db)
        .service(ServiceReceiver(shop.clone()))
        .build()
        .expect("receiver");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = receiver.router();
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });

    // The engine: business row + generated client call in one transaction.
    let engine_db = dir.path().join("engine.db");
    let mut engine_config = Config::for_service("engine");
    engine_config.destinations.insert(
        "shop".into(),
        DestinationConfig::new(url, secret.to_whsec()),
    );
    let outbox = Outbox::new(engine_config, &engine_db);
    let client = ServiceClient::new(outbox.clone(), "shop");
    let mut conn =
        rfidl_runtime::store::sqlite::open(&engine_db, rfidl_runtime::Durability::Normal)
            .expect("open");
    conn.execute_batch("CREATE TABLE fulfilments (order_id TEXT PRIMARY KEY)")
        .expect("table");
    let order_id = Uuid::now_v7();
    let lines = vec![
        OrderLine {
            sku: "SKU-1".into(),
            quantity: 2,
            unit_price: Money {
                amount: Decimal::new(1999, 2),
                currency: "EUR".into(),
            },
        },
        OrderLine {
            sku: "SKU-2".into(),
            quantity: 1,
            unit_price: Money {
                amount: Decimal::new(500, 2),
                currency: "EUR".into(),
            },
        },
    ];
    let tx = conn.transaction().expect("tx");
    tx.execute(
        "INSERT INTO fulfilments (order_id) VALUES (?1)",
        [order_id.to_string()],
    )
    .expect("business row");
    let message_id = client.reserve_stock(&tx, order_id, lines).expect("enqueue");
    tx.commit().expect("commit");

    let dispatcher = Dispatcher::builder(&outbox).start().expect("dispatcher");
    let deadline = Instant::now() + Duration::from_secs(5);
    let row = loop {
        let row = rfidl_runtime::store::sqlite::outbox_row(&conn, &message_id)
            .expect("query")
            .expect("row");
        if row.status == Status::Sent || Instant::now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(row.status, Status::Sent, "{row:?}");
    // The typed response, stored at the sender.
    let reservation: Reservation =
        serde_json::from_value(row.response.expect("response stored")).expect("decodes");
    assert_eq!(reservation.reserved.get("SKU-1"), Some(&2));
    // The effect, exactly once, with the correlation key from @correlate(order_id).
    assert_eq!(shop.reservations.load(Ordering::SeqCst), 1);
    assert_eq!(count(&shop_db, "SELECT COUNT(*) FROM reservations"), 1);
    let correlation: String = rusqlite::Connection::open(&shop_db)
        .and_then(|c| c.query_row("SELECT correlation_id FROM reservations", [], |r| r.get(0)))
        .expect("correlation");
    assert_eq!(correlation, order_id.to_string());
    // The @delivery(max_retries = 3, ttl = "15m") policy reached the outbox row.
    assert_eq!(row.max_retries, 3);
    dispatcher.shutdown().await;
}

#[test]
fn build_rs_options_reach_the_generated_types() {
    // type_derive("shop.orders.StockLevel", "PartialOrd, Ord") in build.rs.
    assert!(StockLevel::InStock < StockLevel::OutOfStock);
}
