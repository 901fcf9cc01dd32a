//! Generates the contracts in `schemas/` into OUT_DIR, as a user's crate would.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rfidl_codegen::Builder::new()
        .type_derive("shop.orders.StockLevel", "PartialOrd, Ord")
        .compile(&["../schemas"])?;
    Ok(())
}
