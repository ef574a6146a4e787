// Another client reads keybus's Redis streams, frames included, from the
// layout docs/formats.md gives ("Redis frames") and nothing else: plain RESP
// over a socket (no Redis package), XRANGE of every partition, each entry
// decoded and every event checked. Run by test_redis_frames:
//   node redis_frames.mjs <port> <topic> <partitions> <keys> <events per key>
// Keys are "agg-<k>", payloads u32 k | u32 seq (little endian), seq 1..N per
// key in order; every 10th event carries the header trace = "t-1".
import net from 'node:net';

const [port, topic, partitions, keys, perKey] = process.argv.slice(2);
const P = Number(partitions), K = Number(keys), N = Number(perKey);

function fail(msg) {
  console.error(`redis_frames.mjs: ${msg}`);
  process.exit(1);
}

// RESP: one reply from buf at off; [value, next offset] or null (incomplete).
function parse(buf, off) {
  const nl = buf.indexOf('\r\n', off);
  if (nl < 0) return null;
  const type = String.fromCharCode(buf[off]);
  const line = buf.toString('latin1', off + 1, nl);
  let at = nl + 2;
  if (type === '+' ) return [line, at];
  if (type === '-') fail(`server error: ${line}`);
  if (type === ':') return [Number(line), at];
  if (type === '$') {
    const n = Number(line);
    if (n < 0) return [null, at];
    if (buf.length < at + n + 2) return null;
    return [buf.subarray(at, at + n), at + n + 2];
  }
  if (type === '*') {
    const n = Number(line), out = [];
    for (let i = 0; i < n; i++) {
      const r = parse(buf, at);
      if (r === null) return null;
      out.push(r[0]);
      at = r[1];
    }
    return [out, at];
  }
  fail(`unexpected reply type ${type}`);
}

function command(sock, args) {
  let s = `*${args.length}\r\n`;
  for (const a of args) s += `$${Buffer.byteLength(a)}\r\n${a}\r\n`;
  return new Promise((resolve) => {
    let buf = Buffer.alloc(0);
    const onData = (d) => {
      buf = Buffer.concat([buf, d]);
      const r = parse(buf, 0);
      if (r !== null) {
        sock.off('data', onData);
        resolve(r[0]);
      }
    };
    sock.on('data', onData);
    sock.write(s);
  });
}

// FNV-1a 32 of the key: its partition (docs/design.md, Routing).
function fnv1a32(b) {
  let h = 0x811c9dc5;
  for (const c of b) h = Math.imul(h ^ c, 0x01000193) >>> 0;
  return h >>> 0;
}

// The frame body: per event u32 key length | key | u32 payload length |
// payload | u16 header count | (u8 name length | name | u32 value length | value)*
function* frameEvents(body, n) {
  let p = 0;
  for (let i = 0; i < n; i++) {
    const kl = body.readUInt32LE(p); p += 4;
    const key = body.subarray(p, p + kl); p += kl;
    const pl = body.readUInt32LE(p); p += 4;
    const payload = body.subarray(p, p + pl); p += pl;
    const nh = body.readUInt16LE(p); p += 2;
    const headers = {};
    for (let h = 0; h < nh; h++) {
      const nl = body[p]; p += 1;
      const name = body.toString('latin1', p, p + nl); p += nl;
      const vl = body.readUInt32LE(p); p += 4;
      headers[name] = body.toString('latin1', p, p + vl); p += vl;
    }
    yield { key, payload, headers, index: i };
  }
  if (p !== body.length) fail(`frame body has ${body.length - p} bytes after its ${n} events`);
}

const sock = net.connect(Number(port), '127.0.0.1');
await new Promise((ok, ko) => { sock.once('connect', ok); sock.once('error', ko); });
const last = new Array(K).fill(0);
let events = 0, frames = 0, plain = 0;
for (let part = 0; part < P; part++) {
  const entries = await command(sock, ['XRANGE', `kb:{${topic}}:p:${part}`, '-', '+']);
  for (const [id, flat] of entries) {
    const f = new Map();
    for (let i = 0; i < flat.length; i += 2) f.set(flat[i].toString('latin1'), flat[i + 1]);
    let evs;
    if (f.has('k')) {
      const headers = {};
      for (const [name, v] of f) if (name.startsWith('h.')) headers[name.slice(2)] = v.toString('latin1');
      evs = [{ key: f.get('k'), payload: f.get('d'), headers }];
      plain++;
    } else if (f.has('f')) {
      if (f.get('f').toString() !== '1') fail(`entry ${id}: frame version ${f.get('f')}`);
      const n = Number(f.get('n').toString());
      if (!(n >= 1 && n <= 4096)) fail(`entry ${id}: n = ${n}`);
      evs = [...frameEvents(f.get('b'), n)];
      if (evs.length !== n) fail(`entry ${id}: ${evs.length} events, n = ${n}`);
      frames++;
    } else {
      fail(`entry ${id}: neither k nor f`);
    }
    for (const ev of evs) {
      if (fnv1a32(ev.key) % P !== part) fail(`entry ${id}: key ${ev.key} in partition ${part}`);
      const k = ev.payload.readUInt32LE(0), seq = ev.payload.readUInt32LE(4);
      if (ev.key.toString() !== `agg-${k}`) fail(`entry ${id}: key ${ev.key} with payload of ${k}`);
      if (seq !== last[k] + 1) fail(`key ${k}: event ${seq} after ${last[k]}`);
      const want = seq % 10 === 0 ? 't-1' : undefined;
      if (ev.headers.trace !== want) fail(`key ${k} event ${seq}: header trace ${ev.headers.trace}`);
      last[k] = seq;
      events++;
    }
  }
}
sock.end();
if (events !== K * N) fail(`${events} events, ${K * N} published`);
for (let k = 0; k < K; k++) if (last[k] !== N) fail(`key ${k} ends at ${last[k]}`);
if (frames === 0) fail('no frame among the entries');
console.error(`redis_frames.mjs: ${events} events checked in ${frames} frames and ${plain} plain entries`);
