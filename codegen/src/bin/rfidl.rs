//! The `rfidl` command-line tool: a thin clap front over the library.

fn main() {
    println!("rfidl: not yet implemented");
}
