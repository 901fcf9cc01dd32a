//! Business write + enqueue in one transaction -> dispatcher -> signed HTTP
//! -> receiver -> handler effect exactly once -> response stored at the
//! sender, all through build.rs-generated code, real SQLite files and real
//! HTTP on 127.0.0.1.

mod orders;
mod remote;
mod versions;
