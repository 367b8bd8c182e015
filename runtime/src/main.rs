//! The `xlfs` command.
fn main() {}
