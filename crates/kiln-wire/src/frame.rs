//! Size-prefixed frames: a big-endian i32 length, then that many bytes.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::WireError;

pub const FRAME_SIZE_PREFIX_LEN: usize = 4;

/// Reads one frame. Returns `Ok(None)` on a clean end of stream between frames.
///
/// The declared size is checked against `max_frame_bytes` before any buffer is
/// allocated, so a peer cannot make the server reserve memory it never sends.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<Option<Bytes>, WireError> {
    let mut prefix = [0u8; FRAME_SIZE_PREFIX_LEN];
    let mut filled = 0;
    while filled < FRAME_SIZE_PREFIX_LEN {
        let n = reader.read(&mut prefix[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(None);
            }
            return Err(WireError::TruncatedFrame {
                received: filled,
                expected: FRAME_SIZE_PREFIX_LEN,
            });
        }
        filled += n;
    }
    let size = i32::from_be_bytes(prefix);
    if size <= 0 {
        return Err(WireError::InvalidFrameSize { size });
    }
    let size = size as usize;
    if size > max_frame_bytes {
        return Err(WireError::FrameTooLarge {
            size: size as u64,
            limit: max_frame_bytes,
        });
    }
    // Read into spare capacity, not a zeroed buffer: zeroing a produce request's megabytes
    // first is a pass over memory for nothing. `take` keeps a read from running past this frame.
    let mut body = BytesMut::with_capacity(size);
    while body.len() < size {
        let rest = (size - body.len()) as u64;
        let n = (&mut *reader).take(rest).read_buf(&mut body).await?;
        if n == 0 {
            return Err(WireError::TruncatedFrame {
                received: body.len(),
                expected: size,
            });
        }
    }
    debug_assert_eq!(body.len(), size);
    Ok(Some(body.freeze()))
}

/// Writes an already size-prefixed frame (as produced by the encoders here).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &[u8],
) -> Result<(), WireError> {
    writer.write_all(frame).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn reads_frames_and_clean_eof() {
        let mut data: &[u8] = &[0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 1, 9];
        assert_eq!(
            read_frame(&mut data, 16).await.unwrap().unwrap().as_ref(),
            &[1, 2, 3]
        );
        assert_eq!(
            read_frame(&mut data, 16).await.unwrap().unwrap().as_ref(),
            &[9]
        );
        assert!(read_frame(&mut data, 16).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn refuses_oversize_before_reading_body() {
        // Claims 2 GiB - 1 but sends nothing more: must fail on the prefix alone.
        let mut data: &[u8] = &[0x7f, 0xff, 0xff, 0xff];
        let err = read_frame(&mut data, 1024).await.unwrap_err();
        assert!(matches!(
            err,
            WireError::FrameTooLarge {
                size: 2147483647,
                limit: 1024
            }
        ));
    }

    /// A body that arrives a few bytes at a time is read whole, and nothing of the frame behind
    /// it is taken with it.
    #[tokio::test]
    async fn reads_a_body_arriving_in_pieces_and_stops_at_its_end() {
        let (mut tx, mut rx) = tokio::io::duplex(7);
        let first: Vec<u8> = (0..200u8).collect();
        let mut wire = (first.len() as u32).to_be_bytes().to_vec();
        wire.extend(&first);
        wire.extend([0, 0, 0, 2, 0xaa, 0xbb]);
        let writer = tokio::spawn(async move {
            for piece in wire.chunks(3) {
                tx.write_all(piece).await.unwrap();
            }
        });
        assert_eq!(
            read_frame(&mut rx, 1024).await.unwrap().unwrap().as_ref(),
            first.as_slice()
        );
        assert_eq!(
            read_frame(&mut rx, 1024).await.unwrap().unwrap().as_ref(),
            &[0xaa, 0xbb]
        );
        writer.await.unwrap();
        assert!(read_frame(&mut rx, 1024).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn rejects_negative_zero_and_truncated() {
        let mut neg: &[u8] = &[0xff, 0xff, 0xff, 0xfe];
        assert!(matches!(
            read_frame(&mut neg, 16).await.unwrap_err(),
            WireError::InvalidFrameSize { size: -2 }
        ));
        let mut zero: &[u8] = &[0, 0, 0, 0];
        assert!(matches!(
            read_frame(&mut zero, 16).await.unwrap_err(),
            WireError::InvalidFrameSize { size: 0 }
        ));
        let mut short_body: &[u8] = &[0, 0, 0, 5, 1, 2];
        assert!(matches!(
            read_frame(&mut short_body, 16).await.unwrap_err(),
            WireError::TruncatedFrame {
                received: 2,
                expected: 5
            }
        ));
        let mut short_prefix: &[u8] = &[0, 0];
        assert!(matches!(
            read_frame(&mut short_prefix, 16).await.unwrap_err(),
            WireError::TruncatedFrame {
                received: 2,
                expected: 4
            }
        ));
    }
}
