//! A length-prefixed bytes codec for request-response.
//!
//! libp2p ships cbor and json codecs, but both would re-encode opaque payloads (cbor turns a
//! `Vec<u8>` into an array of integers unless wrapped); exo's payloads are already msgpack, so
//! the frame is just a length and the bytes. A response carries a status byte so a failing
//! handler reaches the requester as an error instead of a timeout.

use std::io;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::request_response::Codec;
use libp2p::StreamProtocol;

pub const PROTOCOL: StreamProtocol = StreamProtocol::new("/exo/request/1.0.0");

#[derive(Debug, Clone)]
pub enum Reply {
    Ok(Vec<u8>),
    Err(String),
}

#[derive(Debug, Clone)]
pub struct BytesCodec {
    pub max_size: usize,
}

async fn read_frame<T: AsyncRead + Unpin + Send>(io: &mut T, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the limit of {max}"),
        ));
    }
    // Grow as bytes arrive rather than trusting the announced length up front.
    let mut buf = Vec::with_capacity(len.min(1 << 20));
    io.take(len as u64).read_to_end(&mut buf).await?;
    if buf.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buf)
}

async fn write_frame<T: AsyncWrite + Unpin + Send>(io: &mut T, data: &[u8]) -> io::Result<()> {
    let len = u32::try_from(data.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    io.write_all(&len.to_be_bytes()).await?;
    io.write_all(data).await?;
    io.flush().await
}

impl Codec for BytesCodec {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Reply;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_frame(io, self.max_size).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Reply>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut status = [0u8; 1];
        io.read_exact(&mut status).await?;
        let body = read_frame(io, self.max_size).await?;
        match status[0] {
            0 => Ok(Reply::Ok(body)),
            1 => Ok(Reply::Err(String::from_utf8_lossy(&body).into_owned())),
            s => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown response status {s}"),
            )),
        }
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, &req).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Reply,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        match res {
            Reply::Ok(body) => {
                io.write_all(&[0]).await?;
                write_frame(io, &body).await
            }
            Reply::Err(message) => {
                io.write_all(&[1]).await?;
                write_frame(io, message.as_bytes()).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::Cursor;

    #[tokio::test]
    async fn round_trips_and_enforces_the_limit() {
        let mut codec = BytesCodec { max_size: 8 };
        let mut buf = Cursor::new(Vec::new());
        codec
            .write_response(&PROTOCOL, &mut buf, Reply::Err("boom".into()))
            .await
            .unwrap();
        codec
            .write_request(&PROTOCOL, &mut buf, b"12345678".to_vec())
            .await
            .unwrap();
        codec
            .write_request(&PROTOCOL, &mut buf, b"123456789".to_vec())
            .await
            .unwrap();
        buf.set_position(0);
        match codec.read_response(&PROTOCOL, &mut buf).await.unwrap() {
            Reply::Err(m) => assert_eq!(m, "boom"),
            Reply::Ok(_) => panic!("expected an error reply"),
        }
        assert_eq!(
            codec.read_request(&PROTOCOL, &mut buf).await.unwrap(),
            b"12345678"
        );
        assert!(codec.read_request(&PROTOCOL, &mut buf).await.is_err());
    }
}
