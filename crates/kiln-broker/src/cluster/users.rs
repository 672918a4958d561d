//! SCRAM users: credentials live in the metadata log (`Command::ScramCredential`), so every
//! broker of a cluster authenticates the same users, and a change made at one broker (Kafka's
//! AlterUserScramCredentials, `kiln users`) reaches the controller as any other metadata change
//! does: proposed there, or forwarded to it (`forwarded.rs`).
//!
//! The first user: `[sasl] bootstrap_user` and `bootstrap_password_file`. Whichever broker
//! controls the cluster proposes that credential, for every SCRAM mechanism, when the user has
//! none (an `if_absent` command, so brokers that race each other change nothing). A password
//! changed later through the API is not overwritten.
//!
//! The decoy secret: an unknown user is answered with a salt derived from it (kiln-sasl), so
//! it must be the same on every broker, or asking two brokers would tell a real user (same
//! salt everywhere) from an unknown one. The controller draws it once (`ScramDecoySecret`,
//! first one applied wins).

use std::time::Duration;

use kiln_sasl::{Mechanism, ScramCredential};
use serde::{Deserialize, Serialize};

use super::forwarded::TopicChange;
use super::metadata::Command;
use super::{Cluster, ClusterError};

/// Users the metadata log holds credentials for, at most (KIP-554 leaves it open; this keeps
/// the metadata table, which every broker holds in memory, bounded).
pub const SCRAM_USERS_MAX: usize = 10_000;
/// How often a broker checks whether the bootstrap user's credential is in place.
const BOOTSTRAP_POLL: Duration = Duration::from_millis(500);

/// One alteration of AlterUserScramCredentials.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ScramChange {
    Upsert {
        user: String,
        mechanism: Mechanism,
        credential: ScramCredential,
    },
    Delete {
        user: String,
        mechanism: Mechanism,
    },
}

impl ScramChange {
    pub fn user(&self) -> &str {
        match self {
            ScramChange::Upsert { user, .. } | ScramChange::Delete { user, .. } => user,
        }
    }
}

impl Cluster {
    /// `user`'s credential for `mechanism`, as this broker has applied the metadata log.
    pub fn scram_credential(&self, user: &str, mechanism: Mechanism) -> Option<ScramCredential> {
        self.metadata_table.scram_credential(user, mechanism)
    }

    /// Every user, with their mechanisms and iteration counts.
    pub fn scram_users(&self) -> std::collections::BTreeMap<String, Vec<(Mechanism, u32)>> {
        self.metadata_table.scram_users()
    }

    /// Applies one change through the metadata log; forwarded to the controller from any other
    /// broker.
    pub async fn alter_scram(&self, change: ScramChange) -> Result<(), ClusterError> {
        if !self.metadata.is_leader() {
            return self
                .forward_topic_change(TopicChange::Scram { change })
                .await;
        }
        self.alter_scram_here(change).await
    }

    pub(super) async fn alter_scram_here(&self, change: ScramChange) -> Result<(), ClusterError> {
        kiln_sasl::check_user_name(change.user()).map_err(ClusterError::InvalidRequest)?;
        let _one_at_a_time = self.controller_lock.lock().await;
        let users = self.metadata_table.scram_users();
        let command = match change {
            ScramChange::Upsert {
                user,
                mechanism,
                credential,
            } => {
                if !users.contains_key(&user) && users.len() >= SCRAM_USERS_MAX {
                    return Err(ClusterError::InvalidRequest(format!(
                        "the cluster holds credentials for {SCRAM_USERS_MAX} users, its limit"
                    )));
                }
                Command::ScramCredential {
                    user,
                    mechanism,
                    credential: Some(credential),
                    if_absent: false,
                }
            }
            ScramChange::Delete { user, mechanism } => {
                let has = users
                    .get(&user)
                    .is_some_and(|m| m.iter().any(|(have, _)| *have == mechanism));
                if !has {
                    return Err(ClusterError::NotFound(format!(
                        "user {user:?} has no {mechanism} credential"
                    )));
                }
                Command::ScramCredential {
                    user,
                    mechanism,
                    credential: None,
                    if_absent: false,
                }
            }
        };
        self.propose(&command).await
    }

    /// The secret this cluster's brokers derive unknown users' decoy salts from, once the
    /// metadata log holds one (`None` before: a broker then uses its own, drawn at start).
    /// One secret for all brokers, so asking two brokers about an unknown user gets the same
    /// salt, as it would for a real one.
    pub fn scram_decoy_secret(&self) -> Option<Vec<u8>> {
        let hex = self.metadata_table.scram_decoy_secret()?;
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|b| u8::from_str_radix(b, 16).ok())
            })
            .collect();
        bytes.filter(|b| !b.is_empty())
    }

    /// Runs until the metadata log holds a decoy secret: the controller draws and proposes
    /// one.
    pub async fn ensure_scram_decoy_secret(&self) {
        while self.metadata_table.scram_decoy_secret().is_none() {
            if self.metadata.is_leader() {
                let mut secret = [0u8; 32];
                if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
                    .is_err()
                {
                    tracing::error!("the system's random source failed; no cluster decoy secret");
                    return;
                }
                let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
                if let Err(e) = self
                    .propose(&Command::ScramDecoySecret { secret: hex })
                    .await
                {
                    tracing::debug!(error = %e, "decoy secret not proposed yet; retrying");
                }
            }
            tokio::time::sleep(BOOTSTRAP_POLL).await;
        }
    }

    /// Runs until the bootstrap user has a credential for every SCRAM mechanism: proposes the
    /// missing ones while this broker is the controller, else waits for the controller to.
    pub async fn bootstrap_user(&self, user: String, password: Vec<u8>) {
        loop {
            let missing: Vec<Mechanism> = Mechanism::ALL
                .into_iter()
                .filter(|m| self.metadata_table.scram_credential(&user, *m).is_none())
                .collect();
            if missing.is_empty() {
                tracing::info!(%user, "SCRAM bootstrap user in place");
                return;
            }
            if self.metadata.is_leader() {
                for mechanism in missing {
                    let salt = ScramCredential::random_salt();
                    let credential = match ScramCredential::derive(
                        mechanism,
                        &password,
                        &salt,
                        kiln_sasl::ITERATIONS_DEFAULT,
                    ) {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::error!(error = %e, "cannot derive the bootstrap user's credential");
                            return;
                        }
                    };
                    let command = Command::ScramCredential {
                        user: user.clone(),
                        mechanism,
                        credential: Some(credential),
                        if_absent: true,
                    };
                    if let Err(e) = self.propose(&command).await {
                        tracing::debug!(error = %e, "bootstrap user not proposed yet; retrying");
                    }
                }
            }
            tokio::time::sleep(BOOTSTRAP_POLL).await;
        }
    }
}
