//! Finding another running node that holds a copy of our key (a copied data directory).
//!
//! Before a node starts, we dial each bootstrap address and run the handshakes up to noise,
//! which reveals the remote's identity, then hang up before the connection is complete. A
//! remote with a different identity therefore never sees us connect (no PeerConnected and
//! PeerDisconnected pair on every start of every node); one with our own identity is a clone.
//! libp2p's swarm refuses to connect to its own peer id, so a full dial would only report it
//! after establishing connections anyway.

use std::io;
use std::time::Duration;

use futures::future::join_all;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::core::transport::{DialOpts, PortUse};
use libp2p::core::upgrade::OutboundConnectionUpgrade;
use libp2p::core::Endpoint;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::pnet::{PnetConfig, PreSharedKey};
use libp2p::{noise, tcp, Multiaddr, PeerId, Transport};

const MULTISTREAM: &str = "/multistream/1.0.0";

/// Addresses among `addrs` whose node presents `key`'s identity. Addresses that do not answer
/// within `timeout` count as no clone.
pub async fn find_clones(
    key: &Keypair,
    psk: PreSharedKey,
    addrs: Vec<Multiaddr>,
    timeout: Duration,
) -> Vec<String> {
    let local = key.public().to_peer_id();
    let probes = addrs.into_iter().map(|addr| async move {
        let answer = tokio::time::timeout(timeout, identify_remote(key, psk, addr.clone()));
        match answer.await {
            Ok(Ok(peer)) if peer == local => Some(addr.to_string()),
            _ => None,
        }
    });
    join_all(probes).await.into_iter().flatten().collect()
}

/// The peer id of the node at `addr`, learned from the noise handshake.
async fn identify_remote(
    key: &Keypair,
    psk: PreSharedKey,
    mut addr: Multiaddr,
) -> io::Result<PeerId> {
    if let Some(Protocol::P2p(_)) = addr.iter().last() {
        addr.pop(); // whoever answers there, whatever id the address names
    }
    let opts = DialOpts {
        role: Endpoint::Dialer,
        port_use: PortUse::New,
    };
    let socket = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
        .dial(addr, opts)
        .map_err(io::Error::other)?
        .await?;
    let mut socket = PnetConfig::new(psk)
        .handshake(socket)
        .await
        .map_err(io::Error::other)?;
    select_protocol(&mut socket, "/noise").await?;
    let noise = noise::Config::new(key).map_err(io::Error::other)?;
    let (peer, _) = noise
        .upgrade_outbound(socket, "/noise")
        .await
        .map_err(io::Error::other)?;
    Ok(peer) // dropping the connection here: the remote's next negotiation step fails
}

/// The dialer's side of multistream-select 1.0, waiting for the remote's confirmation.
async fn select_protocol<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    name: &str,
) -> io::Result<()> {
    write_message(io, MULTISTREAM).await?;
    write_message(io, name).await?;
    io.flush().await?;
    for expected in [MULTISTREAM, name] {
        let got = read_message(io).await?;
        if got != expected {
            return Err(io::Error::other(format!(
                "expected {expected:?}, got {got:?}"
            )));
        }
    }
    Ok(())
}

async fn write_message<S: AsyncWrite + Unpin>(io: &mut S, text: &str) -> io::Result<()> {
    // Each message is a varint length, then the text and a newline (all short: one byte).
    let len = u8::try_from(text.len() + 1)
        .ok()
        .filter(|n| *n < 0x80)
        .ok_or_else(|| io::Error::other("protocol name too long"))?;
    io.write_all(&[len]).await?;
    io.write_all(text.as_bytes()).await?;
    io.write_all(b"\n").await
}

async fn read_message<S: AsyncRead + Unpin>(io: &mut S) -> io::Result<String> {
    let mut len = [0u8; 1];
    io.read_exact(&mut len).await?;
    if len[0] >= 0x80 || len[0] == 0 {
        return Err(io::Error::other("unexpected multistream message length"));
    }
    let mut buf = vec![0u8; len[0] as usize];
    io.read_exact(&mut buf).await?;
    buf.pop(); // the newline
    String::from_utf8(buf).map_err(io::Error::other)
}
