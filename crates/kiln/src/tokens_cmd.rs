//! `kiln tokens create|list|revoke`: the bearer tokens of intake and the dashboard, kept as
//! hashes in a token file (kiln-web's `tokens`). A running service reads the file again
//! within a second of a change.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use kiln_web::tokens;

#[derive(Debug, Args)]
pub struct TokensArgs {
    /// The token file (created, readable by its owner only, by the first `create`).
    #[arg(long, global = true, env = "KILN_TOKENS_FILE")]
    file: Option<PathBuf>,
    #[command(subcommand)]
    command: TokensCommand,
}

#[derive(Debug, Subcommand)]
enum TokensCommand {
    /// Add a token and print it (the only time it is shown: the file keeps its hash).
    Create {
        /// The token's name: what the services' logs call its requests.
        name: String,
        /// read (the dashboard), write (intake), or read,write.
        #[arg(long)]
        scope: String,
    },
    /// The tokens in the file: name and scopes.
    List,
    /// Take a token out of the file; services refuse it within a second.
    Revoke { name: String },
}

pub fn run(args: TokensArgs) -> anyhow::Result<()> {
    let Some(file) = args.file else {
        anyhow::bail!("give the token file: --file FILE or KILN_TOKENS_FILE");
    };
    match args.command {
        TokensCommand::Create { name, scope } => {
            let scopes = tokens::Scopes::parse(&scope)
                .map_err(|why| anyhow::anyhow!("--scope {scope}: {why}"))?;
            let token = tokens::add(&file, &name, scopes)?;
            eprintln!(
                "added token {name} ({scopes}) to {}; it is shown once, here:",
                file.display()
            );
            println!("{token}");
        }
        TokensCommand::List => {
            let tokens = tokens::load(&file)?;
            if tokens.entries().is_empty() {
                eprintln!("{} holds no tokens", file.display());
            }
            for e in tokens.entries() {
                println!("{:<24} {}", e.name, e.scopes);
            }
        }
        TokensCommand::Revoke { name } => {
            tokens::revoke(&file, &name)?;
            println!("revoked token {name}");
        }
    }
    Ok(())
}
