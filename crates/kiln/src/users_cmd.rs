//! `kiln users`: SCRAM users of a `[sasl]` listener, over the Kafka protocol
//! (AlterUserScramCredentials, DescribeUserScramCredentials), so it works against Apache Kafka
//! too. The password is salted and hashed here; the broker receives SaltedPassword only.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest, RequestKind,
    ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kiln_client::Connection;
use kiln_sasl::{Mechanism, ScramCredential};

use crate::broker_address::BrokerAddress;
use crate::topics_cmd::error_text;

#[derive(Args, Debug)]
pub struct UsersArgs {
    #[command(flatten)]
    broker: BrokerAddress,
    #[command(subcommand)]
    command: UsersCommand,
}

#[derive(Subcommand, Debug)]
enum UsersCommand {
    /// Create a user, or set a new password: a credential for each mechanism.
    Create {
        name: String,
        /// File whose first line is the new user's password (else KILN_NEW_USER_PASSWORD).
        #[arg(long)]
        password_file: Option<std::path::PathBuf>,
        /// SCRAM-SHA-512 and/or SCRAM-SHA-256 (default both).
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
        /// PBKDF2 iterations, 4096 to 16384.
        #[arg(long, default_value_t = kiln_sasl::ITERATIONS_DEFAULT)]
        iterations: u32,
    },
    /// Remove a user's credentials (every mechanism unless --mechanism names some).
    Delete {
        name: String,
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
    },
    /// Every user with its mechanisms and iteration counts.
    List,
}

pub async fn run(args: UsersArgs) -> anyhow::Result<()> {
    let timeout = args.broker.timeout();
    let security = args.broker.security()?;
    let conn = args.broker.connect().await?;
    let mut conn = crate::topics_cmd::connect_controller(conn, timeout, &security).await?;
    let request = match args.command {
        UsersCommand::List => return list(&mut conn, timeout).await,
        UsersCommand::Create {
            name,
            password_file,
            mechanisms,
            iterations,
        } => {
            let password = new_password(password_file.as_deref())?;
            kiln_sasl::check_iterations(iterations)
                .map_err(|e| anyhow::anyhow!("--iterations: {e}"))?;
            upsert_request(
                &name,
                &password,
                &parse_mechanisms(&mechanisms)?,
                iterations,
            )?
        }
        UsersCommand::Delete { name, mechanisms } => {
            let chosen = if mechanisms.is_empty() {
                held(&mut conn, timeout, &name).await?
            } else {
                parse_mechanisms(&mechanisms)?
            };
            let deletions = chosen
                .into_iter()
                .map(|m| {
                    ScramCredentialDeletion::default()
                        .with_name(StrBytes::from_string(name.clone()))
                        .with_mechanism(m.kafka_type())
                })
                .collect();
            AlterUserScramCredentialsRequest::default().with_deletions(deletions)
        }
    };
    let changes = alter(&mut conn, timeout, request).await?;
    println!("{changes} credential change(s) applied");
    Ok(())
}

/// Creates `name`, or sets its password, with a credential for each of `mechanisms` (salted
/// and hashed here; the broker receives SaltedPassword only) through `conn`, which must be
/// the controller's. Returns the number of credentials written.
pub async fn create_user(
    conn: &mut Connection,
    timeout: std::time::Duration,
    name: &str,
    password: &str,
    mechanisms: &[Mechanism],
    iterations: u32,
) -> anyhow::Result<usize> {
    if password.is_empty() || password.len() > kiln_sasl::PASSWORD_BYTES_MAX {
        bail!("a password is 1 to {} bytes", kiln_sasl::PASSWORD_BYTES_MAX);
    }
    kiln_sasl::check_iterations(iterations).map_err(anyhow::Error::msg)?;
    let request = upsert_request(name, password, mechanisms, iterations)?;
    alter(conn, timeout, request).await
}

/// The upsertions that give `name` this password under each mechanism.
fn upsert_request(
    name: &str,
    password: &str,
    mechanisms: &[Mechanism],
    iterations: u32,
) -> anyhow::Result<AlterUserScramCredentialsRequest> {
    let mut upsertions = Vec::new();
    for m in mechanisms {
        let salt = ScramCredential::random_salt();
        let salted = m.salted_password(password.as_bytes(), &salt, iterations);
        upsertions.push(
            ScramCredentialUpsertion::default()
                .with_name(StrBytes::from_string(name.to_string()))
                .with_mechanism(m.kafka_type())
                .with_iterations(i32::try_from(iterations)?)
                .with_salt(salt.into())
                .with_salted_password(salted.into()),
        );
    }
    Ok(AlterUserScramCredentialsRequest::default().with_upsertions(upsertions))
}

/// Sends `request`'s changes one at a time; the number applied, or the first refusal.
async fn alter(
    conn: &mut Connection,
    timeout: std::time::Duration,
    request: AlterUserScramCredentialsRequest,
) -> anyhow::Result<usize> {
    let changes = request.upsertions.len() + request.deletions.len();
    // One user per request: Kafka refuses a user named twice, so send one mechanism at a time.
    for (upsertions, deletions) in request
        .upsertions
        .into_iter()
        .map(|u| (vec![u], vec![]))
        .chain(request.deletions.into_iter().map(|d| (vec![], vec![d])))
    {
        let one = AlterUserScramCredentialsRequest::default()
            .with_upsertions(upsertions)
            .with_deletions(deletions);
        let ResponseKind::AlterUserScramCredentials(r) = conn
            .call(RequestKind::AlterUserScramCredentials(one), timeout)
            .await?
        else {
            bail!("unexpected answer to AlterUserScramCredentials");
        };
        for result in r.results {
            if result.error_code != 0 {
                bail!(
                    "user {}: {}",
                    result.user.as_str(),
                    error_text(result.error_code, result.error_message.as_ref())
                );
            }
        }
    }
    Ok(changes)
}

fn parse_mechanisms(names: &[String]) -> anyhow::Result<Vec<Mechanism>> {
    if names.is_empty() {
        return Ok(Mechanism::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| {
            Mechanism::from_name(n)
                .with_context(|| format!("--mechanism {n:?} is not SCRAM-SHA-512 or SCRAM-SHA-256"))
        })
        .collect()
}

fn new_password(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    let password = match file {
        Some(f) => kiln_settings::read_secret_file("--password-file", f)?,
        None => std::env::var("KILN_NEW_USER_PASSWORD")
            .context("a new password comes from --password-file FILE or KILN_NEW_USER_PASSWORD")?,
    };
    if password.is_empty() || password.len() > kiln_sasl::PASSWORD_BYTES_MAX {
        bail!("a password is 1 to {} bytes", kiln_sasl::PASSWORD_BYTES_MAX);
    }
    Ok(password)
}

async fn describe(
    conn: &mut Connection,
    timeout: std::time::Duration,
    users: Option<Vec<UserName>>,
) -> anyhow::Result<Vec<(String, i16, String, Vec<(Mechanism, i32)>)>> {
    let request = DescribeUserScramCredentialsRequest::default().with_users(users);
    let ResponseKind::DescribeUserScramCredentials(r) = conn
        .call(RequestKind::DescribeUserScramCredentials(request), timeout)
        .await?
    else {
        bail!("unexpected answer to DescribeUserScramCredentials");
    };
    if r.error_code != 0 {
        bail!(
            "DescribeUserScramCredentials: {}",
            error_text(r.error_code, r.error_message.as_ref())
        );
    }
    Ok(r.results
        .into_iter()
        .map(|u| {
            let infos = u
                .credential_infos
                .iter()
                .filter_map(|c| Mechanism::from_kafka_type(c.mechanism).map(|m| (m, c.iterations)))
                .collect();
            let message = u.error_message.map(|m| m.to_string()).unwrap_or_default();
            (u.user.to_string(), u.error_code, message, infos)
        })
        .collect())
}

/// The mechanisms `user` has credentials for (an error when it has none).
async fn held(
    conn: &mut Connection,
    timeout: std::time::Duration,
    user: &str,
) -> anyhow::Result<Vec<Mechanism>> {
    let wanted = vec![UserName::default().with_name(StrBytes::from_string(user.to_string()))];
    let found = describe(conn, timeout, Some(wanted)).await?;
    match found.into_iter().next() {
        Some((_, 0, _, infos)) if !infos.is_empty() => {
            Ok(infos.into_iter().map(|(m, _)| m).collect())
        }
        Some((_, _, message, _)) if !message.is_empty() => bail!("{message}"),
        _ => bail!("user {user:?} has no SCRAM credentials"),
    }
}

async fn list(conn: &mut Connection, timeout: std::time::Duration) -> anyhow::Result<()> {
    let users = describe(conn, timeout, None).await?;
    println!("{:<32} MECHANISMS", "USER");
    for (user, _, _, infos) in users {
        let shown: Vec<String> = infos
            .iter()
            .map(|(m, iterations)| format!("{m} ({iterations} iterations)"))
            .collect();
        println!("{user:<32} {}", shown.join(", "));
    }
    Ok(())
}
