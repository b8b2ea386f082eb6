//! The swarm: its configuration and the task that drives it.
//!
//! The swarm lives in its own tokio task and is driven continuously, whatever Python does
//! (exo's earlier binding polled it only inside `recv()`, so a slow consumer stalled
//! keep-alives and gossip). Python talks to it through a command channel and reads what it
//! receives from the two `Inbox`es in `Shared`.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::upgrade::Version;
use libp2p::core::transport::Boxed;
use libp2p::gossipsub::{self, IdentTopic, MessageAuthenticity, PublishError, ValidationMode};
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::pnet::{PnetConfig, PreSharedKey};
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport, ResponseChannel};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, DialError, ListenError, NetworkBehaviour, SwarmEvent};
use libp2p::{identify, mdns, noise, ping, tcp, yamux, Multiaddr, PeerId, Swarm, Transport};
use tokio::sync::{mpsc, oneshot};

use crate::codec::{BytesCodec, Reply, PROTOCOL};
use crate::inbox::Inbox;

/// Room that gossipsub's frame needs beyond the payload (topic, signature, key, sequence
/// number). The receiving side enforces `max_transmit_size` on the whole frame, so the
/// payload limit we promise callers is the protocol limit minus this.
const GOSSIP_FRAME_OVERHEAD: usize = 4096;
/// How often bootstrap peers that are not connected are dialed again.
const REDIAL_EVERY: Duration = Duration::from_secs(2);
/// At most one slow-peer (or dropped-publish) notice per peer in this window, so a stuck
/// peer or a publishing burst cannot flood the logs.
const SLOW_PEER_NOTICE_EVERY: Duration = Duration::from_secs(10);

pub struct Config {
    pub key: Keypair,
    /// The private network's key (from the cluster key and the namespace, see
    /// `exo_core.cluster_key`): peers without it fail the first handshake.
    pub network_key: PreSharedKey,
    pub listen_host: String,
    pub port: u16,
    pub bootstrap: Vec<Multiaddr>,
    pub mdns: bool,
    /// Largest broadcast payload accepted by `publish`.
    pub max_broadcast_size: usize,
    /// Largest request or response payload.
    pub max_request_size: usize,
    /// Broadcasts held for Python before older-than-read ones are dropped (and reported).
    pub inbox_capacity: usize,
}

/// What `events()` yields, in arrival order.
pub enum Event {
    Message {
        topic: String,
        sender: String,
        payload: Vec<u8>,
    },
    Connected(String),
    Disconnected(String),
}

/// What the Python side handles itself, apart from the consumer of `events()`.
pub enum Control {
    Request {
        id: u64,
        peer: String,
        payload: Vec<u8>,
    },
    /// Another process presented our own peer id. `dialer` is true when we dialed it.
    DuplicateIdentity { address: String, dialer: bool },
    /// Something worth a log line on the Python side (level is a loguru level name).
    Notice {
        level: &'static str,
        message: String,
    },
}

pub struct Shared {
    pub events: Inbox<Event>,
    pub control: Inbox<Control>,
    pub peers: Mutex<BTreeSet<String>>,
    pub listen_addrs: Mutex<Vec<Multiaddr>>,
}

impl Shared {
    fn notice(&self, level: &'static str, message: String) {
        self.control.push(Control::Notice { level, message });
    }
}

pub enum RequestError {
    /// The remote handler failed; its message.
    Remote(String),
    /// The request never got an answer (dial failure, closed connection, I/O).
    Failed(String),
}

pub enum Command {
    Subscribe(String, oneshot::Sender<Result<(), String>>),
    Unsubscribe(String),
    Publish(String, Vec<u8>),
    Request(
        PeerId,
        Vec<u8>,
        oneshot::Sender<Result<Vec<u8>, RequestError>>,
    ),
    Respond(u64, Reply),
    AddBootstrap(Multiaddr),
    Stop(oneshot::Sender<()>),
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    gossipsub: gossipsub::Behaviour,
    request: request_response::Behaviour<BytesCodec>,
    mdns: Toggle<mdns::tokio::Behaviour>,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
}

type BoxedTransport = Boxed<(PeerId, StreamMuxerBox)>;

/// TCP, then the private network, then noise and yamux. Nodes with another network key
/// (another cluster key or namespace) fail the pnet handshake, so they never even see each
/// other's identities.
fn build_transport(key: &Keypair, psk: PreSharedKey) -> Result<BoxedTransport, String> {
    let noise = noise::Config::new(key).map_err(|e| e.to_string())?;
    Ok(
        tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
            // pnet wraps the raw socket, before any libp2p protocol byte is exchanged.
            .and_then(move |socket, _| PnetConfig::new(psk).handshake(socket))
            .upgrade(Version::V1Lazy)
            .authenticate(noise)
            .multiplex(yamux::Config::default())
            .timeout(Duration::from_secs(20))
            .map(|(peer, muxer), _| (peer, StreamMuxerBox::new(muxer)))
            .boxed(),
    )
}

fn build_swarm(cfg: &Config) -> Result<Swarm<Behaviour>, String> {
    let key = cfg.key.clone();
    let peer_id = key.public().to_peer_id();
    let transport = build_transport(&key, cfg.network_key)?;

    let gossip_config = gossipsub::ConfigBuilder::default()
        .validation_mode(ValidationMode::Strict)
        .max_transmit_size(cfg.max_broadcast_size + GOSSIP_FRAME_OVERHEAD)
        .heartbeat_interval(Duration::from_millis(700))
        .build()
        .map_err(|e| e.to_string())?;
    let gossipsub =
        gossipsub::Behaviour::new(MessageAuthenticity::Signed(key.clone()), gossip_config)
            .map_err(|e| e.to_string())?;

    let request = request_response::Behaviour::with_codec(
        BytesCodec {
            // The response frame also carries its status byte.
            max_size: cfg.max_request_size + 1,
        },
        [(PROTOCOL, ProtocolSupport::Full)],
        // Per-call timeouts are applied by the caller; this only bounds forgotten streams.
        request_response::Config::default()
            .with_request_timeout(Duration::from_secs(300))
            .with_max_concurrent_streams(1024),
    );

    let mdns = if cfg.mdns {
        let mdns_config = mdns::Config {
            query_interval: Duration::from_secs(5),
            ..Default::default()
        };
        Some(mdns::tokio::Behaviour::new(mdns_config, peer_id).map_err(|e| e.to_string())?)
    } else {
        None
    };

    let identify = identify::Behaviour::new(
        identify::Config::new("/exo/1.0.0".into(), key.public()).with_agent_version(format!(
            "exo-transport-libp2p/{}",
            env!("CARGO_PKG_VERSION")
        )),
    );
    // Ping failures are turned into closed connections below, so a dead peer is noticed
    // within interval + timeout.
    let ping = ping::Behaviour::new(
        ping::Config::new()
            .with_interval(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10)),
    );

    let behaviour = Behaviour {
        gossipsub,
        request,
        mdns: mdns.into(),
        identify,
        ping,
    };
    let swarm_config = libp2p::swarm::Config::with_tokio_executor()
        // Cluster peers stay connected even while no protocol is busy; ping decides liveness.
        .with_idle_connection_timeout(Duration::from_secs(24 * 3600));
    Ok(Swarm::new(transport, behaviour, peer_id, swarm_config))
}

fn listen_addr(host: &str, port: u16) -> Result<Multiaddr, String> {
    let ip: IpAddr = host
        .parse()
        .map_err(|_| format!("listen host {host:?} is not an IP address"))?;
    let mut addr = Multiaddr::from(ip);
    addr.push(Protocol::Tcp(port));
    Ok(addr)
}

/// A bootstrap address and what we know about who answers there.
struct Bootstrap {
    addr: Multiaddr,
    /// The peer id given in the address (`/p2p/...`), if any.
    expected: Option<PeerId>,
    /// The peer that answered last time, for addresses given without a peer id.
    learned: Option<PeerId>,
    dialing: Option<ConnectionId>,
    /// Answered with our own identity: not dialed again (the clash is reported once).
    clashed: bool,
}

impl Bootstrap {
    fn new(mut addr: Multiaddr) -> Self {
        let expected = match addr.iter().last() {
            Some(Protocol::P2p(peer)) => {
                addr.pop();
                Some(peer)
            }
            _ => None,
        };
        Self {
            addr,
            expected,
            learned: None,
            dialing: None,
            clashed: false,
        }
    }
}

struct Driver {
    swarm: Swarm<Behaviour>,
    shared: Arc<Shared>,
    bootstrap: Vec<Bootstrap>,
    max_broadcast_size: usize,
    pending: HashMap<OutboundRequestId, oneshot::Sender<Result<Vec<u8>, RequestError>>>,
    inbound: HashMap<u64, ResponseChannel<Reply>>,
    next_inbound: u64,
    /// Per slow peer: messages dropped since the last notice, and when that notice went out.
    slow_peers: HashMap<PeerId, (usize, Option<Instant>)>,
    /// Peers mDNS reported and has not expired, with their addresses.
    mdns_peers: HashMap<PeerId, Vec<Multiaddr>>,
    /// Broadcasts gossipsub refused because every peer's send queue was full: not yet
    /// reported, and when the last report went out.
    publish_drops: (usize, Option<Instant>),
    listening: Option<oneshot::Sender<Result<(), String>>>,
}

/// Start a node: returns once it listens. The swarm then runs in its own task until `Stop`.
pub async fn start(
    cfg: Config,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
) -> Result<(), String> {
    if cfg.port != 0 {
        // libp2p listens with SO_REUSEPORT, so a second node on the same fixed port would
        // share it (the kernel splitting connections between the two). A plain bind first
        // turns that mistake into an error.
        let ip: IpAddr = cfg
            .listen_host
            .parse()
            .map_err(|_| format!("listen host {:?} is not an IP address", cfg.listen_host))?;
        std::net::TcpListener::bind((ip, cfg.port))
            .map_err(|e| format!("cannot listen on {}:{}: {e}", cfg.listen_host, cfg.port))?;
    }
    let mut swarm = build_swarm(&cfg)?;
    swarm
        .listen_on(listen_addr(&cfg.listen_host, cfg.port)?)
        .map_err(|e| format!("cannot listen on {}:{}: {e}", cfg.listen_host, cfg.port))?;
    let (listening_tx, listening_rx) = oneshot::channel();
    let driver = Driver {
        swarm,
        shared,
        bootstrap: cfg.bootstrap.into_iter().map(Bootstrap::new).collect(),
        max_broadcast_size: cfg.max_broadcast_size,
        pending: HashMap::new(),
        inbound: HashMap::new(),
        next_inbound: 0,
        slow_peers: HashMap::new(),
        mdns_peers: HashMap::new(),
        publish_drops: (0, None),
        listening: Some(listening_tx),
    };
    tokio::spawn(driver.run(commands));
    match tokio::time::timeout(Duration::from_secs(10), listening_rx).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err("the node stopped before it listened".into()),
        Err(_) => Err("timed out waiting for the listener".into()),
    }
}

impl Drop for Driver {
    /// However the driver ends (stopped, or its runtime shut down), readers see the end.
    fn drop(&mut self) {
        self.shared
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.shared.events.close();
        self.shared.control.close();
    }
}

impl Driver {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut redial = tokio::time::interval(REDIAL_EVERY);
        redial.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stop_reply = loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                command = commands.recv() => match command {
                    None => break None,
                    Some(Command::Stop(reply)) => break Some(reply),
                    Some(command) => self.on_command(command),
                },
                _ = redial.tick() => {
                    self.dial_bootstrap();
                    let found: Vec<PeerId> = self.mdns_peers.keys().copied().collect();
                    for peer in found {
                        self.dial_mdns_peer(peer);
                    }
                    self.report_publish_drops(false);
                }
            }
        };
        self.shutdown().await;
        drop(self); // closes the queues before the stopper resumes
        if let Some(reply) = stop_reply {
            let _ = reply.send(());
        }
    }

    /// Close every connection (so peers see us leave at once, and our consumer sees the
    /// disconnects), then end the queues.
    async fn shutdown(&mut self) {
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for peer in peers {
            let _ = self.swarm.disconnect_peer_id(peer);
        }
        let deadline = tokio::time::sleep(Duration::from_secs(1));
        tokio::pin!(deadline);
        while self.swarm.connected_peers().next().is_some() {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                _ = &mut deadline => break,
            }
        }
        self.report_publish_drops(true);
        // Requests still waiting fail now rather than at their timeout.
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(RequestError::Failed("transport stopped".into())));
        }
    }

    fn is_own_address(&self, addr: &Multiaddr) -> bool {
        let mut addr = addr.clone();
        if let Some(Protocol::P2p(_)) = addr.iter().last() {
            addr.pop();
        }
        if self.swarm.listeners().any(|a| *a == addr) {
            return true;
        }
        // A loopback or unspecified address on one of our ports is us too.
        let mut ip = None;
        let mut port = None;
        for p in addr.iter() {
            match p {
                Protocol::Ip4(a) => ip = Some(IpAddr::V4(a)),
                Protocol::Ip6(a) => ip = Some(IpAddr::V6(a)),
                Protocol::Tcp(p) => port = Some(p),
                _ => {}
            }
        }
        let (Some(ip), Some(port)) = (ip, port) else {
            return false;
        };
        (ip.is_loopback() || ip.is_unspecified())
            && self
                .swarm
                .listeners()
                .any(|a| a.iter().any(|p| p == Protocol::Tcp(port)))
    }

    fn dial_bootstrap(&mut self) {
        if self.listening.is_some() {
            return; // dial once we know our own addresses, to recognise dials to ourselves
        }
        let local = *self.swarm.local_peer_id();
        for i in 0..self.bootstrap.len() {
            let b = &self.bootstrap[i];
            if b.dialing.is_some() || b.clashed {
                continue;
            }
            let known = b.expected.or(b.learned);
            if self.is_own_address(&b.addr)
                || known.is_some_and(|p| p != local && self.swarm.is_connected(&p))
            {
                continue;
            }
            let opts = match b.expected {
                // Our own id at another address: dial it anyway, it is how a cloned identity
                // is found (the swarm reports LocalPeerId once the handshake completes).
                Some(peer) if peer != local => DialOpts::peer_id(peer)
                    .addresses(vec![b.addr.clone()])
                    .condition(PeerCondition::DisconnectedAndNotDialing)
                    .allocate_new_port()
                    .build(),
                _ => DialOpts::unknown_peer_id()
                    .address(b.addr.clone())
                    .allocate_new_port()
                    .build(),
            };
            let id = opts.connection_id();
            match self.swarm.dial(opts) {
                Ok(()) => self.bootstrap[i].dialing = Some(id),
                // DialPeerConditionFalse: someone else is already dialing that peer.
                Err(DialError::DialPeerConditionFalse(_)) => {}
                Err(e) => self
                    .shared
                    .notice("DEBUG", format!("dial {} failed: {e}", b.addr)),
            }
        }
    }

    /// Dial a peer mDNS found, unless connected or being dialed already. mDNS reports a peer
    /// once per record, so the redial tick calls this too: a failed or dropped connection
    /// is retried while the record lives.
    fn dial_mdns_peer(&mut self, peer: PeerId) {
        let Some(addrs) = self.mdns_peers.get(&peer) else {
            return;
        };
        let opts = DialOpts::peer_id(peer)
            .addresses(addrs.clone())
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .allocate_new_port()
            .build();
        let _ = self.swarm.dial(opts);
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Subscribe(topic, reply) => {
                let result = self
                    .swarm
                    .behaviour_mut()
                    .gossipsub
                    .subscribe(&IdentTopic::new(topic))
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                let _ = reply.send(result);
            }
            Command::Unsubscribe(topic) => {
                self.swarm
                    .behaviour_mut()
                    .gossipsub
                    .unsubscribe(&IdentTopic::new(topic));
            }
            Command::Publish(topic, payload) => self.publish(topic, payload),
            Command::Request(peer, payload, reply) => {
                let id = self
                    .swarm
                    .behaviour_mut()
                    .request
                    .send_request(&peer, payload);
                self.pending.insert(id, reply);
            }
            Command::Respond(id, reply) => {
                if let Some(channel) = self.inbound.remove(&id) {
                    // Fails only when the requester is gone; nothing left to do then.
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .request
                        .send_response(channel, reply);
                }
            }
            Command::AddBootstrap(addr) => {
                self.bootstrap.push(Bootstrap::new(addr));
                self.dial_bootstrap();
            }
            Command::Stop(_) => unreachable!("handled by the loop"),
        }
    }

    fn publish(&mut self, topic: String, payload: Vec<u8>) {
        if payload.len() > self.max_broadcast_size {
            // The Python-facing method checks this first; this is a second line of defence.
            self.shared.notice(
                "ERROR",
                format!("dropped a {} byte broadcast: over the limit", payload.len()),
            );
            return;
        }
        match self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(IdentTopic::new(topic.clone()), payload)
        {
            Ok(_) => {}
            // No subscribed peer yet: delivered to nobody, which best effort allows.
            Err(PublishError::NoPeersSubscribedToTopic | PublishError::Duplicate) => {}
            Err(PublishError::AllQueuesFull(_)) => {
                self.publish_drops.0 += 1;
                self.report_publish_drops(false);
            }
            Err(e) => self
                .shared
                .notice("ERROR", format!("broadcast on {topic:?} failed: {e}")),
        }
    }

    /// Report broadcasts dropped for full send queues: the first at once, then in sums.
    fn report_publish_drops(&mut self, flush: bool) {
        let (count, last) = self.publish_drops;
        let due = last.is_none_or(|t| t.elapsed() >= SLOW_PEER_NOTICE_EVERY);
        if count == 0 || !(due || flush) {
            return;
        }
        self.publish_drops = (0, Some(Instant::now()));
        self.shared.notice(
            "WARNING",
            format!("{count} broadcasts dropped: the send queues of all their peers were full"),
        );
    }

    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            SwarmEvent::NewListenAddr { address, .. } => {
                self.shared
                    .listen_addrs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(address);
                if let Some(tx) = self.listening.take() {
                    let _ = tx.send(Ok(()));
                    self.dial_bootstrap();
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                self.shared
                    .listen_addrs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|a| *a != address);
            }
            SwarmEvent::ListenerError { error, .. } => {
                let message = format!("listener failed: {error}");
                match self.listening.take() {
                    Some(tx) => {
                        let _ = tx.send(Err(message));
                    }
                    None => self.shared.notice("ERROR", message),
                }
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                for b in &mut self.bootstrap {
                    if b.dialing == Some(connection_id) {
                        b.dialing = None;
                        b.learned = Some(peer_id);
                    }
                }
                // Once per peer: only the first connection announces it.
                if num_established.get() == 1 {
                    let peer = peer_id.to_string();
                    self.shared
                        .peers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(peer.clone());
                    self.shared.events.push(Event::Connected(peer));
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
                // Only the last connection's close announces the peer gone.
                self.slow_peers.remove(&peer_id);
                let peer = peer_id.to_string();
                self.shared
                    .peers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&peer);
                self.shared.events.push(Event::Disconnected(peer));
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                error,
                ..
            } => {
                let clashed = matches!(error, DialError::LocalPeerId { .. });
                for b in &mut self.bootstrap {
                    if b.dialing == Some(connection_id) {
                        b.dialing = None;
                        b.clashed = clashed;
                    }
                }
                match error {
                    DialError::LocalPeerId { address } if !self.is_own_address(&address) => {
                        self.shared.control.push(Control::DuplicateIdentity {
                            address: address.to_string(),
                            dialer: true,
                        });
                    }
                    error => self
                        .shared
                        .notice("DEBUG", format!("outgoing connection failed: {error}")),
                }
            }
            SwarmEvent::IncomingConnectionError {
                error: ListenError::LocalPeerId { address },
                ..
            } => {
                self.shared.control.push(Control::DuplicateIdentity {
                    address: address.to_string(),
                    dialer: false,
                });
            }
            SwarmEvent::IncomingConnectionError { error, .. } => {
                // Includes peers of other clusters (keys, namespaces) failing the pnet handshake.
                self.shared
                    .notice("DEBUG", format!("incoming connection failed: {error}"));
            }
            _ => {}
        }
    }

    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
            BehaviourEvent::Gossipsub(event) => self.on_gossip_event(event),
            BehaviourEvent::Request(event) => self.on_request_event(event),
            BehaviourEvent::Mdns(mdns::Event::Discovered(found)) => {
                let mut fresh = Vec::new();
                for (peer, addr) in found {
                    let addrs = self.mdns_peers.entry(peer).or_default();
                    if !addrs.contains(&addr) {
                        addrs.push(addr);
                    }
                    fresh.push(peer);
                }
                for peer in fresh {
                    self.dial_mdns_peer(peer);
                }
            }
            BehaviourEvent::Mdns(mdns::Event::Expired(gone)) => {
                for (peer, addr) in gone {
                    if let Some(addrs) = self.mdns_peers.get_mut(&peer) {
                        addrs.retain(|a| *a != addr);
                        if addrs.is_empty() {
                            self.mdns_peers.remove(&peer);
                        }
                    }
                }
            }
            BehaviourEvent::Ping(ping::Event {
                peer,
                connection,
                result: Err(error),
            }) => {
                self.shared.notice(
                    "INFO",
                    format!("closing a connection to {peer}: ping failed ({error})"),
                );
                self.swarm.close_connection(connection);
            }
            BehaviourEvent::Ping(_) | BehaviourEvent::Identify(_) => {}
        }
    }

    fn on_gossip_event(&mut self, event: gossipsub::Event) {
        match event {
            gossipsub::Event::Message { message, .. } => {
                // Strict validation guarantees a signed source on every message.
                let Some(source) = message.source else {
                    return;
                };
                self.shared.events.offer_or_lag(Event::Message {
                    topic: message.topic.into_string(),
                    sender: source.to_string(),
                    payload: message.data,
                });
            }
            gossipsub::Event::SlowPeer {
                peer_id,
                failed_messages,
            } => {
                let entry = self.slow_peers.entry(peer_id).or_insert((0, None));
                entry.0 += failed_messages.priority + failed_messages.non_priority;
                if entry
                    .1
                    .is_none_or(|t| t.elapsed() >= SLOW_PEER_NOTICE_EVERY)
                {
                    let dropped = entry.0;
                    *entry = (0, Some(Instant::now()));
                    self.shared.notice(
                        "WARNING",
                        format!("peer {peer_id} is slow: {dropped} messages to it were dropped"),
                    );
                }
            }
            gossipsub::Event::GossipsubNotSupported { peer_id } => self.shared.notice(
                "WARNING",
                format!("peer {peer_id} does not speak gossipsub"),
            ),
            gossipsub::Event::Subscribed { .. } | gossipsub::Event::Unsubscribed { .. } => {}
        }
    }

    fn on_request_event(&mut self, event: request_response::Event<Vec<u8>, Reply>) {
        use request_response::{Event as E, Message as M};
        match event {
            E::Message {
                peer,
                message: M::Request {
                    request, channel, ..
                },
                ..
            } => {
                let id = self.next_inbound;
                self.next_inbound += 1;
                let offered = self.shared.control.offer(Control::Request {
                    id,
                    peer: peer.to_string(),
                    payload: request,
                });
                match offered {
                    Ok(()) => {
                        self.inbound.insert(id, channel);
                    }
                    Err(_) => {
                        // Too many requests waiting for Python: answer at once so the
                        // requester fails fast instead of timing out.
                        let _ = self.swarm.behaviour_mut().request.send_response(
                            channel,
                            Reply::Err("the node is overloaded with requests".into()),
                        );
                    }
                }
            }
            E::Message {
                message:
                    M::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                if let Some(reply) = self.pending.remove(&request_id) {
                    let _ = reply.send(match response {
                        Reply::Ok(body) => Ok(body),
                        Reply::Err(message) => Err(RequestError::Remote(message)),
                    });
                }
            }
            E::OutboundFailure {
                request_id, error, ..
            } => {
                if let Some(reply) = self.pending.remove(&request_id) {
                    let _ = reply.send(Err(RequestError::Failed(error.to_string())));
                }
            }
            E::InboundFailure { peer, error, .. } => self.shared.notice(
                "DEBUG",
                format!("inbound request from {peer} failed: {error}"),
            ),
            E::ResponseSent { .. } => {}
        }
    }
}
