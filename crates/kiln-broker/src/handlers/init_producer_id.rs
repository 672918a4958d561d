//! InitProducerId: a new producer id (epoch 0) for an idempotent producer. Any broker answers:
//! ids come in blocks allocated through the metadata log (`cluster/producer_ids.rs`), and the
//! producer's sequence numbers are checked per partition by the partition's leader
//! (kiln-raft's `producers.rs`). Transactions are not supported: a request with a
//! transactional id is refused.

use std::sync::Arc;

use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProducerId, ResponseKind,
};
use kafka_protocol::ResponseError;

use super::Reply;
use crate::cluster::Cluster;

pub fn handle(cluster: &Arc<Cluster>, request: InitProducerIdRequest) -> Reply {
    if let Some(id) = &request.transactional_id {
        tracing::warn!(transactional_id = %id.0, "InitProducerId with a transactional id: transactions are not supported");
        return Reply::Now(Box::new(response(
            ResponseError::InvalidRequest.code(),
            -1,
            -1,
        )));
    }
    let cluster = cluster.clone();
    Reply::Later(Box::pin(async move {
        match cluster.next_producer_id().await {
            Ok(id) => response(0, id, 0),
            Err(e) => {
                tracing::warn!(error = %e, "no producer id to give; the client retries");
                // Retriable: clients ask again (another broker, or this one once it has a block).
                response(ResponseError::CoordinatorNotAvailable.code(), -1, -1)
            }
        }
    }))
}

fn response(error_code: i16, producer_id: i64, producer_epoch: i16) -> ResponseKind {
    ResponseKind::InitProducerId(
        InitProducerIdResponse::default()
            .with_error_code(error_code)
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch),
    )
}
