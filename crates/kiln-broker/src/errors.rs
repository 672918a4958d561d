//! Storage and catalog errors as Kafka error codes.

use kafka_protocol::ResponseError;
use kiln_log::LogError;

use crate::CatalogError;

pub fn log_error_code(error: &LogError) -> ResponseError {
    match error {
        LogError::InvalidBatch { .. } | LogError::CrcMismatch { .. } => {
            ResponseError::CorruptMessage
        }
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        LogError::Corrupt { .. }
        | LogError::DiskFull { .. }
        | LogError::Io { .. }
        | LogError::Poisoned(_)
        | LogError::Closed => ResponseError::KafkaStorageError,
    }
}

pub fn catalog_error_code(error: &CatalogError) -> ResponseError {
    match error {
        CatalogError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
        CatalogError::NotFound(_) => ResponseError::UnknownTopicOrPartition,
        CatalogError::InvalidName(_) => ResponseError::InvalidTopicException,
        CatalogError::InvalidPartitions(_) => ResponseError::InvalidPartitions,
        CatalogError::InvalidConfig(_) => ResponseError::InvalidConfig,
        CatalogError::Log(e) => log_error_code(e),
        CatalogError::Io { .. } | CatalogError::BadMetadata { .. } => {
            ResponseError::KafkaStorageError
        }
    }
}
