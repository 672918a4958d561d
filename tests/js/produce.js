// node produce.js BOOTSTRAP TOPIC MODE KEYS PER_KEY
//
// Writes KEYS x PER_KEY keyed records `key-K:S` (S rising per key): the first half one
// record per send() (so each ack names that record's partition and offset), the second half
// in one send() of many messages (batched per partition). MODE is `idempotent` or `default`.
//
// Idempotent: `idempotent: true` and `maxInFlightRequests: 1`. kafkajs gives a batch its
// sequence numbers when it is sent and advances them only when the answer arrives, so an
// idempotent producer must have one request in flight; its docs pair `idempotent: true`
// with `maxInFlightRequests: 1` (KIP-98's rule for the idempotent producer). Acks are
// kafkajs' default, -1 (all), which idempotence requires; retries are its idempotent
// default (unlimited).
//
// Prints {"acked": [[partition, offset, key, value], ...] for the single sends,
//         "batch": [[partition, baseOffset], ...] for the batched send, "problems": [...]}.
'use strict';
const { client, main } = require('./common');

const [bootstrap, topic, mode, keys, perKey] = process.argv.slice(2);
if (!perKey || !['idempotent', 'default'].includes(mode)) {
  process.stderr.write('usage: node produce.js BOOTSTRAP TOPIC idempotent|default KEYS PER_KEY\n');
  process.exit(64);
}

main(async () => {
  const kafka = client(bootstrap, `kiln-test-producer-${mode}`);
  const producer = kafka.producer(mode === 'idempotent' ? { idempotent: true, maxInFlightRequests: 1 } : {});
  await producer.connect();
  const items = [];
  for (let s = 0; s < Number(perKey); s++) {
    for (let k = 0; k < Number(keys); k++) items.push({ key: `key-${k}`, value: `key-${k}:${s}` });
  }
  const half = Math.floor(items.length / 2);
  const acked = [];
  for (const m of items.slice(0, half)) {
    const [md] = await producer.send({ topic, messages: [m] });
    acked.push([md.partition, Number(md.baseOffset), m.key, m.value]);
  }
  const mds = await producer.send({ topic, messages: items.slice(half) });
  const batch = mds.map((md) => [md.partition, Number(md.baseOffset)]);
  await producer.disconnect();
  return { acked, batch };
});
