//! The kvcore command-line tool.

use clap::{Parser, Subcommand};

mod demo;

/// kvcore: a KV-cache engine core for LLM serving.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// A short demonstration of the engine that prints its events.
    Demo,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        None | Some(Command::Demo) => demo::run(),
    }
}
