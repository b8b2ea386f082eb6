/* linkemu: a userspace Ethernet switch over TAP devices that emulates each link's delay,
 * jitter, loss, reordering and rate, and can cut any link. Built and driven by
 * exo_core/testing/linkemu.py (this kernel has no netem, so tc cannot do it).
 *
 *   linkemu SEED TAP0 TAP1 ...      creates the TAP devices (IFF_TAP|IFF_NO_PI, not
 *                                   persistent: they vanish when this process ends), prints
 *                                   "ready", then reads commands on stdin, one a line, and
 *                                   answers each with one line ("ok", "err ...", or stats).
 *
 * Commands (A and B are port numbers, or * for every port; a link is directional, A -> B):
 *   set A B DELAY_US JITTER_US LOSS_PPM RATE_BPS REORDER_PPM   (RATE_BPS 0: unlimited)
 *   cut A B      drop every frame from A to B       heal A B     let them through again
 *   stats        "stats FORWARDED DROPPED_LOSS DROPPED_CUT DROPPED_QUEUE"
 *
 * Switching: the source MAC of every frame is learned; a frame to a known unicast MAC goes to
 * that port only; broadcast, multicast (mDNS) and unknown destinations are flooded to every
 * other port, each copy through its own link's rules. A frame's time of arrival is
 * now + its link's queueing (RATE) + DELAY + a uniform draw in [-JITTER, +JITTER]; frames
 * wait in one heap ordered by that time, so jitter reorders as netem's does. REORDER_PPM of
 * the frames skip the delay (they overtake the ones waiting). Each link holds at most
 * QUEUE_LIMIT frames (more are dropped, as a full router queue drops them). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 256
#define FRAME_MAX 9216
#define QUEUE_LIMIT 2000
#define MAC_SLOTS 4096

typedef struct {
  int64_t delay_ns, jitter_ns, rate_bps;
  uint32_t loss_ppm, reorder_ppm;
  int cut;
  int64_t busy_until; /* when the link's queue empties, for the rate limit */
  int queued;
} Link;

typedef struct {
  int64_t due;
  uint64_t seq;
  int from, to;
  int len;
  unsigned char *data;
} Pending;

static int nports;
static int fds[MAX_PORTS];
static Link links[MAX_PORTS][MAX_PORTS];
static Pending *heap;
static size_t heap_len, heap_cap;
static uint64_t seq_counter, n_forwarded, n_loss, n_cut, n_queue;
static uint64_t rng_state;
static struct {
  unsigned char mac[6];
  int port; /* -1: empty */
} macs[MAC_SLOTS];

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static uint64_t rnd(void) { /* xorshift64*: reproducible for a given seed */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ULL;
}

static int heap_less(const Pending *a, const Pending *b) {
  return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void heap_push(Pending p) {
  if (heap_len == heap_cap) {
    heap_cap = heap_cap ? heap_cap * 2 : 1024;
    heap = realloc(heap, heap_cap * sizeof(Pending));
    if (!heap) { perror("realloc"); exit(1); }
  }
  size_t i = heap_len++;
  heap[i] = p;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!heap_less(&heap[i], &heap[parent])) break;
    Pending t = heap[i]; heap[i] = heap[parent]; heap[parent] = t;
    i = parent;
  }
}

static Pending heap_pop(void) {
  Pending top = heap[0];
  heap[0] = heap[--heap_len];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < heap_len && heap_less(&heap[l], &heap[m])) m = l;
    if (r < heap_len && heap_less(&heap[r], &heap[m])) m = r;
    if (m == i) break;
    Pending t = heap[i]; heap[i] = heap[m]; heap[m] = t;
    i = m;
  }
  return top;
}

static unsigned mac_hash(const unsigned char *mac) {
  unsigned h = 2166136261u;
  for (int i = 0; i < 6; i++) h = (h ^ mac[i]) * 16777619u;
  return h % MAC_SLOTS;
}

static void mac_learn(const unsigned char *mac, int port) {
  if (mac[0] & 1) return; /* a multicast source is bogus */
  unsigned h = mac_hash(mac);
  for (int probe = 0; probe < MAC_SLOTS; probe++, h = (h + 1) % MAC_SLOTS) {
    if (macs[h].port < 0 || memcmp(macs[h].mac, mac, 6) == 0) {
      memcpy(macs[h].mac, mac, 6);
      macs[h].port = port;
      return;
    }
  }
}

static int mac_port(const unsigned char *mac) {
  unsigned h = mac_hash(mac);
  for (int probe = 0; probe < MAC_SLOTS; probe++, h = (h + 1) % MAC_SLOTS) {
    if (macs[h].port < 0) return -1;
    if (memcmp(macs[h].mac, mac, 6) == 0) return macs[h].port;
  }
  return -1;
}

static int open_tap(const char *name) {
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) { perror("/dev/net/tun"); exit(1); }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) { fprintf(stderr, "TUNSETIFF %s: %s\n", name, strerror(errno)); exit(1); }
  return fd;
}

static void deliver(Pending *p) {
  links[p->from][p->to].queued--;
  if (write(fds[p->to], p->data, p->len) == p->len) n_forwarded++;
  else n_queue++; /* the device's own queue is full (or it is down): a drop */
  free(p->data);
}

static void send_copy(int from, int to, const unsigned char *frame, int len, int64_t now) {
  Link *k = &links[from][to];
  if (k->cut) { n_cut++; return; }
  if (k->loss_ppm && rnd() % 1000000 < k->loss_ppm) { n_loss++; return; }
  if (k->queued >= QUEUE_LIMIT) { n_queue++; return; }
  int64_t due = now;
  if (k->rate_bps > 0) {
    int64_t start = k->busy_until > now ? k->busy_until : now;
    k->busy_until = start + (int64_t)len * 8 * 1000000000LL / k->rate_bps;
    due = k->busy_until;
  }
  if (!(k->reorder_ppm && rnd() % 1000000 < k->reorder_ppm)) {
    due += k->delay_ns;
    if (k->jitter_ns > 0) due += (int64_t)(rnd() % (uint64_t)(2 * k->jitter_ns + 1)) - k->jitter_ns;
  }
  k->queued++;
  Pending p = {due, seq_counter++, from, to, len, NULL};
  if (due <= now && heap_len == 0) { /* the fast path: nothing waits, nothing to wait for */
    p.data = (unsigned char *)frame;
    links[from][to].queued--;
    if (write(fds[to], frame, len) == len) n_forwarded++;
    else n_queue++;
    return;
  }
  p.data = malloc(len);
  if (!p.data) { n_queue++; k->queued--; return; }
  memcpy(p.data, frame, len);
  heap_push(p);
}

static void on_frame(int from, unsigned char *frame, int len) {
  if (len < 14) return;
  int64_t now = now_ns();
  mac_learn(frame + 6, from);
  int to = (frame[0] & 1) ? -1 : mac_port(frame);
  if (to >= 0) {
    if (to != from) send_copy(from, to, frame, len, now);
    return;
  }
  for (int p = 0; p < nports; p++)
    if (p != from) send_copy(from, p, frame, len, now);
}

static void for_links(const char *a, const char *b, void (*fn)(Link *, void *), void *arg) {
  for (int i = 0; i < nports; i++) {
    if (strcmp(a, "*") != 0 && atoi(a) != i) continue;
    for (int j = 0; j < nports; j++) {
      if (i == j || (strcmp(b, "*") != 0 && atoi(b) != j)) continue;
      fn(&links[i][j], arg);
    }
  }
}

typedef struct { long long delay_us, jitter_us, loss_ppm, rate_bps, reorder_ppm; } Params;

static void apply_set(Link *k, void *arg) {
  Params *p = arg;
  k->delay_ns = p->delay_us * 1000;
  k->jitter_ns = p->jitter_us * 1000;
  k->loss_ppm = (uint32_t)p->loss_ppm;
  k->rate_bps = p->rate_bps;
  k->reorder_ppm = (uint32_t)p->reorder_ppm;
}
static void apply_cut(Link *k, void *arg) { (void)arg; k->cut = 1; }
static void apply_heal(Link *k, void *arg) { (void)arg; k->cut = 0; }

static int valid_port(const char *s) {
  if (strcmp(s, "*") == 0) return 1;
  char *end;
  long v = strtol(s, &end, 10);
  return *s && !*end && v >= 0 && v < nports;
}

static void command(char *line) {
  char op[16], a[16], b[16];
  Params p;
  int n = sscanf(line, "%15s %15s %15s %lld %lld %lld %lld %lld", op, a, b, &p.delay_us,
                 &p.jitter_us, &p.loss_ppm, &p.rate_bps, &p.reorder_ppm);
  if (n >= 1 && strcmp(op, "stats") == 0) {
    printf("stats %llu %llu %llu %llu\n", (unsigned long long)n_forwarded,
           (unsigned long long)n_loss, (unsigned long long)n_cut, (unsigned long long)n_queue);
  } else if (n < 3 || !valid_port(a) || !valid_port(b)) {
    printf("err bad command: %s\n", line);
  } else if (strcmp(op, "set") == 0 && n == 8 && p.delay_us >= 0 && p.jitter_us >= 0 &&
             p.loss_ppm >= 0 && p.loss_ppm <= 1000000 && p.rate_bps >= 0 &&
             p.reorder_ppm >= 0 && p.reorder_ppm <= 1000000) {
    for_links(a, b, apply_set, &p);
    printf("ok\n");
  } else if (strcmp(op, "cut") == 0) {
    for_links(a, b, apply_cut, NULL);
    printf("ok\n");
  } else if (strcmp(op, "heal") == 0) {
    for_links(a, b, apply_heal, NULL);
    printf("ok\n");
  } else {
    printf("err bad command: %s\n", line);
  }
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc < 3 || argc - 2 > MAX_PORTS) {
    fprintf(stderr, "usage: linkemu SEED TAP0 TAP1 ... (at most %d)\n", MAX_PORTS);
    return 2;
  }
  rng_state = strtoull(argv[1], NULL, 10) * 2654435761ULL + 88172645463325252ULL;
  nports = argc - 2;
  for (int i = 0; i < MAC_SLOTS; i++) macs[i].port = -1;
  for (int i = 0; i < nports; i++) fds[i] = open_tap(argv[i + 2]);
  static struct pollfd pfds[MAX_PORTS + 1];
  pfds[0].fd = 0;
  pfds[0].events = POLLIN;
  for (int i = 0; i < nports; i++) { pfds[i + 1].fd = fds[i]; pfds[i + 1].events = POLLIN; }
  printf("ready\n");
  fflush(stdout);
  static char cmdbuf[4096];
  size_t cmdlen = 0;
  static unsigned char frame[FRAME_MAX];
  for (;;) {
    int64_t now = now_ns();
    while (heap_len && heap[0].due <= now) {
      Pending p = heap_pop();
      deliver(&p);
    }
    struct timespec timeout, *tp = NULL;
    if (heap_len) {
      int64_t wait = heap[0].due - now;
      timeout.tv_sec = wait / 1000000000LL;
      timeout.tv_nsec = wait % 1000000000LL;
      tp = &timeout;
    }
    int ready = ppoll(pfds, (nfds_t)nports + 1, tp, NULL);
    if (ready < 0) {
      if (errno == EINTR) continue;
      perror("ppoll");
      return 1;
    }
    if (pfds[0].revents) {
      ssize_t got = read(0, cmdbuf + cmdlen, sizeof cmdbuf - 1 - cmdlen);
      if (got <= 0) return 0; /* the driver is gone: so are we, and the TAP devices */
      cmdlen += (size_t)got;
      cmdbuf[cmdlen] = 0;
      char *start = cmdbuf, *nl;
      while ((nl = strchr(start, '\n'))) {
        *nl = 0;
        command(start);
        start = nl + 1;
      }
      cmdlen = strlen(start);
      memmove(cmdbuf, start, cmdlen);
      if (cmdlen == sizeof cmdbuf - 1) cmdlen = 0; /* an endless line: drop it */
    }
    for (int i = 0; i < nports; i++) {
      if (!(pfds[i + 1].revents & POLLIN)) continue;
      /* A batch per device per round, so one busy port cannot starve the others. */
      for (int batch = 0; batch < 64; batch++) {
        ssize_t len = read(fds[i], frame, sizeof frame);
        if (len <= 0) break;
        on_frame(i, frame, (int)len);
      }
    }
  }
}
