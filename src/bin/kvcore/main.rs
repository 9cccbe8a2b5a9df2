//! The kvcore command-line tool.

fn main() {
    println!("kvcore");
}
