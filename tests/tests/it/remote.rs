//! `shop.orders.OrderService v1` is generated from the pinned manifest in
//! `rfidl.lock` + `remote-cache/` (see build.rs), not from its contract. The
//! pin must follow the contract: `generated-examples` holds the manifests of
//! `schemas/` (its drift test keeps them current), so the lock must name
//! the fingerprint found there, and the cache must hold that revision.

use std::path::Path;

fn json(path: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_pinned_order_service_is_the_one_schemas_declares() {
    let lock = json("rfidl.lock");
    let pinned = &lock["interfaces"][0];
    assert_eq!(pinned["interface"], "shop.orders.OrderService");
    let published =
        json("../generated-examples/src/generated/manifests/shop.orders.OrderService.v1.json");
    assert_eq!(
        pinned["fingerprint"], published["fingerprint"],
        "schemas/orders.rfidl changed: run `cargo xtask regen` to re-pin tests/rfidl.lock \
         and refresh tests/remote-cache"
    );
    let fingerprint = published["fingerprint"].as_str().expect("a fingerprint");
    let hex = fingerprint.trim_start_matches("sha256:");
    let cached = format!("remote-cache/shop.orders.OrderService/v1/{hex}.json");
    assert!(Path::new(&cached).is_file(), "{cached} is missing");
    assert_eq!(json(&cached), published);
}

#[test]
fn the_generated_constant_carries_the_pinned_fingerprint() {
    let lock = json("rfidl.lock");
    assert_eq!(
        rfidl_e2e::contracts::shop::orders::order_service_v1::FINGERPRINT,
        lock["interfaces"][0]["fingerprint"]
            .as_str()
            .expect("a fingerprint")
    );
}
