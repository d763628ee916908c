#!/usr/bin/env bash
# A network-filesystem stand-in for benchmarks/shards_throughput.py --mount: a private sshd on a
# loopback port (its own host key, one authorized key, all in STATE) and an sshfs mount of SRC at
# MNT through it, with sshfs's directory cache off and the kernel's page cache bypassed (direct_io),
# so every open, stat and read is a real SFTP round trip over SSH. With DELAY_MS > 0, sshfs reaches
# sshd through a TCP relay on PORT+1 that holds every chunk DELAY_MS milliseconds in each direction
# (a network's one-way delay, for kernels without tc's netem; no bandwidth limit).
#
#   benchmarks/sshfs_stand_in.sh up SRC MNT [STATE] [PORT] [DELAY_MS]   # needs sshfs and openssh-server (apt-get install -y sshfs openssh-server)
#   benchmarks/sshfs_stand_in.sh latency DIR                 # per-file and per-read times under DIR (the mount or the local folder)
#   benchmarks/sshfs_stand_in.sh down MNT [STATE]
set -euo pipefail

cmd=${1:?usage: $0 up SRC MNT [STATE] [PORT] [DELAY_MS] | latency DIR | down MNT [STATE]}
case $cmd in
up)
    src=$(realpath "${2:?SRC}"); mnt=${3:?MNT}; state=${4:-/tmp/hvdtrain-sshfs}; port=${5:-2222}; delay=${6:-0}
    for tool in /usr/sbin/sshd sshfs; do
        command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install -y sshfs openssh-server" >&2; exit 1; }
    done
    mkdir -p "$state" "$mnt" /run/sshd
    [ -f "$state/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$state/host_ed25519"
    [ -f "$state/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$state/client_ed25519"
    cp "$state/client_ed25519.pub" "$state/authorized_keys"
    cat > "$state/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $state/host_ed25519
AuthorizedKeysFile $state/authorized_keys
PidFile $state/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
EOF
    /usr/sbin/sshd -f "$state/sshd_config"
    sleep 0.5
    target=$port
    if [ "$delay" != 0 ]; then
        target=$((port + 1))
        nohup python3 - "$target" "$port" "$delay" > "$state/relay.log" 2>&1 <<'EOF' &
import asyncio, sys, time
listen, upstream, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000

async def pump(reader, writer):
    queue = asyncio.Queue()
    async def send():
        while (item := await queue.get()) is not None:
            due, data = item
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()
    sender = asyncio.create_task(send())
    while data := await reader.read(1 << 16):
        queue.put_nowait((time.monotonic() + delay, data))
    queue.put_nowait(None)
    await sender

async def handle(reader, writer):
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
    await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer), return_exceptions=True)

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    await server.serve_forever()

asyncio.run(main())
EOF
        echo $! > "$state/relay.pid"
        sleep 0.5
    fi
    sshfs -p "$target" "$(id -un)@127.0.0.1:$src" "$mnt" \
        -o IdentityFile="$state/client_ed25519",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR \
        -o dir_cache=no,direct_io
    echo "mounted $src at $mnt over sshfs (sshd on 127.0.0.1:$port, pid $(cat "$state/sshd.pid"); added one-way delay ${delay} ms)"
    ;;
latency)
    mnt=${2:?DIR}
    # median times of a stat and of an open+read+close of 200 different photos (one file per image,
    # as an ImageFolder tree reads), and of a 100 KiB pread at 200 offsets of already-open tar shards
    # (as the shard reader reads), under DIR
    python3 - "$mnt" <<'EOF'
import os, random, statistics, sys, time
root = sys.argv[1]
walk = [(d, f) for d, _, fs in os.walk(root) for f in sorted(fs)]
photos = [os.path.join(d, f) for d, f in walk if f.lower().endswith((".jpg", ".jpeg", ".png"))][:200]
tars = [os.path.join(d, f) for d, f in walk if f.endswith(".tar")]
stats, opens, preads = [], [], []
for path in photos:
    t = time.perf_counter(); os.stat(path); stats.append(time.perf_counter() - t)
    t = time.perf_counter()
    with open(path, "rb") as f:
        f.read()
    opens.append(time.perf_counter() - t)
line = f"{root}: median stat {1e3 * statistics.median(stats):.2f} ms, open+read+close of a photo " \
       f"{1e3 * statistics.median(opens):.2f} ms ({len(photos)} photos)"
if tars:
    fds, rng = [os.open(p, os.O_RDONLY) for p in tars], random.Random(0)
    for _ in range(200):
        fd = rng.choice(fds)
        offset = rng.randrange(max(1, os.fstat(fd).st_size - 102400))
        t = time.perf_counter(); os.pread(fd, 102400, offset); preads.append(time.perf_counter() - t)
    line += f", 100 KiB pread of an open tar {1e3 * statistics.median(preads):.2f} ms"
print(line)
EOF
    ;;
down)
    mnt=${2:?MNT}; state=${3:-/tmp/hvdtrain-sshfs}
    fusermount3 -u "$mnt" || true
    for pidfile in "$state/sshd.pid" "$state/relay.pid"; do
        if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" || true; rm -f "$pidfile"; fi
    done
    echo "unmounted $mnt"
    ;;
*)
    echo "unknown command $cmd: up, latency or down" >&2; exit 2 ;;
esac
