//! Generates the contracts into OUT_DIR, as a user's crate would.
//!
//! `hr.employees` comes from its contract file. `shop.orders.OrderService v1`
//! comes the way another team's interface does: by name, pinned in
//! `rfidl.lock`, its manifest read from the offline cache in `remote-cache/`
//! (what `rfidl fetch` fills). This build never needs a registry.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rfidl_codegen::Builder::new()
        .type_derive("shop.orders.StockLevel", "PartialOrd, Ord")
        .remote("shop.orders.OrderService", 1)
        .lock_file("rfidl.lock")
        .cache_dir("remote-cache")
        .compile(&["../schemas/hr.rfidl"])?;
    Ok(())
}
