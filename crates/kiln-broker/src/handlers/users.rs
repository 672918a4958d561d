//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): SCRAM users in the
//! metadata log (`cluster/users.rs`). An upsertion carries the client's SaltedPassword; the
//! broker keeps only StoredKey and ServerKey derived from it. Describe never returns key
//! material, only the mechanisms and iteration counts.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use kiln_sasl::{Mechanism, ScramCredential};

use crate::cluster::users::{ScramChange, SCRAM_USERS_MAX};
use crate::cluster::{Cluster, ClusterError};
use crate::errors::cluster_error_code;
use crate::handlers::Reply;

/// An alteration's error code and message.
type Refusal = (ResponseError, String);

/// Alterations in one AlterUserScramCredentials request (each is a metadata log write).
const ALTERATIONS_PER_REQUEST_MAX: usize = 100;

pub fn describe(
    cluster: &Cluster,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let users = cluster.scram_users();
    let wanted: Vec<String> = match &request.users {
        // Null or empty: every user (KIP-554).
        None => users.keys().cloned().collect(),
        Some(list) if list.is_empty() => users.keys().cloned().collect(),
        Some(list) => {
            if list.len() > SCRAM_USERS_MAX {
                return DescribeUserScramCredentialsResponse::default()
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(StrBytes::from_string(format!(
                        "at most {SCRAM_USERS_MAX} users per request"
                    ))));
            }
            list.iter().map(|u| u.name.to_string()).collect()
        }
    };
    let mut seen = BTreeSet::new();
    let results = wanted
        .into_iter()
        .map(|user| {
            let result = DescribeUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user.clone()));
            if !seen.insert(user.clone()) {
                return result
                    .with_error_code(ResponseError::DuplicateResource.code())
                    .with_error_message(Some(StrBytes::from_string(format!(
                        "user {user:?} named twice"
                    ))));
            }
            match users.get(&user) {
                Some(list) => result.with_credential_infos(
                    list.iter()
                        .map(|(m, iterations)| {
                            CredentialInfo::default()
                                .with_mechanism(m.kafka_type())
                                .with_iterations(i32::try_from(*iterations).unwrap_or(i32::MAX))
                        })
                        .collect(),
                ),
                None => result
                    .with_error_code(ResponseError::ResourceNotFound.code())
                    .with_error_message(Some(StrBytes::from_string(format!(
                        "user {user:?} has no SCRAM credentials"
                    )))),
            }
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// The answer to a principal that may not manage users: CLUSTER_AUTHORIZATION_FAILED, for
/// the request as a whole (Describe) or for every user it names (Alter), saying `why`.
pub fn refuse(
    body: &kafka_protocol::messages::RequestKind,
    why: &'static str,
) -> Option<ResponseKind> {
    use kafka_protocol::messages::RequestKind;
    let code = ResponseError::ClusterAuthorizationFailed.code();
    let message = || Some(StrBytes::from_static_str(why));
    match body {
        RequestKind::DescribeUserScramCredentials(_) => {
            Some(ResponseKind::DescribeUserScramCredentials(
                DescribeUserScramCredentialsResponse::default()
                    .with_error_code(code)
                    .with_error_message(message()),
            ))
        }
        RequestKind::AlterUserScramCredentials(r) => {
            let users = r
                .deletions
                .iter()
                .map(|d| d.name.clone())
                .chain(r.upsertions.iter().map(|u| u.name.clone()));
            let results = users
                .map(|user| {
                    AlterUserScramCredentialsResult::default()
                        .with_user(user)
                        .with_error_code(code)
                        .with_error_message(message())
                })
                .collect();
            Some(ResponseKind::AlterUserScramCredentials(
                AlterUserScramCredentialsResponse::default().with_results(results),
            ))
        }
        _ => None,
    }
}

pub fn alter(cluster: &Arc<Cluster>, request: AlterUserScramCredentialsRequest) -> Reply {
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        let count = request.deletions.len() + request.upsertions.len();
        let mut changes: Vec<(String, Result<ScramChange, Refusal>)> =
            Vec::with_capacity(count.min(ALTERATIONS_PER_REQUEST_MAX));
        let too_many = count > ALTERATIONS_PER_REQUEST_MAX;
        for d in &request.deletions {
            let user = d.name.to_string();
            let change = mechanism(d.mechanism).map(|mechanism| ScramChange::Delete {
                user: user.clone(),
                mechanism,
            });
            changes.push((user, change));
        }
        for u in &request.upsertions {
            let user = u.name.to_string();
            let change = mechanism(u.mechanism).and_then(|mechanism| {
                let iterations = u32::try_from(u.iterations).unwrap_or(0);
                ScramCredential::from_salted_password(
                    mechanism,
                    &u.salt,
                    iterations,
                    &u.salted_password,
                )
                .map(|credential| ScramChange::Upsert {
                    user: user.clone(),
                    mechanism,
                    credential,
                })
                .map_err(|e| (ResponseError::UnacceptableCredential, e))
            });
            changes.push((user, change));
        }
        // Kafka refuses a user named more than once in one request, all of its alterations.
        let mut named = std::collections::BTreeMap::<String, usize>::new();
        for (user, _) in &changes {
            *named.entry(user.clone()).or_default() += 1;
        }
        let mut results = Vec::with_capacity(changes.len());
        for (user, change) in changes {
            let outcome = if too_many {
                Err((
                    ResponseError::InvalidRequest,
                    format!("at most {ALTERATIONS_PER_REQUEST_MAX} alterations per request"),
                ))
            } else if named.get(&user).copied().unwrap_or(0) > 1 {
                Err((
                    ResponseError::DuplicateResource,
                    format!("user {user:?} altered more than once in one request"),
                ))
            } else {
                match change {
                    Ok(change) => cluster.alter_scram(change).await.map_err(|e| match e {
                        ClusterError::NotFound(m) => (ResponseError::ResourceNotFound, m),
                        ClusterError::InvalidRequest(m) => {
                            (ResponseError::UnacceptableCredential, m)
                        }
                        other => (cluster_error_code(&other), other.to_string()),
                    }),
                    Err(e) => Err(e),
                }
            };
            let result = AlterUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user.clone()));
            results.push(match outcome {
                Ok(()) => result,
                Err((code, message)) => {
                    tracing::info!(%user, %message, "SCRAM credential change refused");
                    result
                        .with_error_code(code.code())
                        .with_error_message(Some(StrBytes::from_string(message)))
                }
            });
        }
        ResponseKind::AlterUserScramCredentials(
            AlterUserScramCredentialsResponse::default().with_results(results),
        )
    }))
}

fn mechanism(code: i8) -> Result<Mechanism, Refusal> {
    Mechanism::from_kafka_type(code).ok_or_else(|| {
        (
            ResponseError::UnsupportedSaslMechanism,
            format!("SCRAM mechanism {code} is not 1 (SCRAM-SHA-256) or 2 (SCRAM-SHA-512)"),
        )
    })
}
