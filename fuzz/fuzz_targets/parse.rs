//! Feeds arbitrary bytes to the parser and the formatter: neither may panic,
//! and formatting what parses must give text that parses to the same tree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rfidl_codegen::diagnostics::FileId;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if rfidl_codegen::syntax::parse_file(FileId::default(), text).is_ok() {
        let formatted = rfidl_codegen::format::format_source(text).expect("parsed input formats");
        assert!(rfidl_codegen::syntax::parse_file(FileId::default(), &formatted).is_ok());
    }
});
