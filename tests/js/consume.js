// node consume.js BOOTSTRAP TOPIC GROUP STOP_AFTER END_JSON
//
// One member of consumer group GROUP on TOPIC, `autoCommit: false`, committing by hand with
// `commitOffsets` after processing each batch (the offset after the last record processed).
// Before it joins, it reads what the group has committed (admin.fetchOffsets) and prints it.
// STOP_AFTER >= 0: it processes exactly that many records (stopping inside a batch if need
// be), commits them and leaves the group. STOP_AFTER = -1: it reads until every partition's
// next offset reaches END_JSON ({"partition": end offset}), committing as it goes.
//
// Prints {"committed_at_start": {partition: offset or -1},
//         "records": [[partition, offset, key, value], ...] in processing order,
//         "committed": {partition: offset} what it committed, "problems": [...]}.
'use strict';
const { client, main } = require('./common');

const [bootstrap, topic, group, stopAfterArg, endJson] = process.argv.slice(2);
if (!endJson) {
  process.stderr.write('usage: node consume.js BOOTSTRAP TOPIC GROUP STOP_AFTER END_JSON\n');
  process.exit(64);
}
const stopAfter = Number(stopAfterArg);
const end = JSON.parse(endJson);

main(async () => {
  const kafka = client(bootstrap, 'kiln-test-consumer');
  const admin = kafka.admin();
  await admin.connect();
  const [fetched] = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  await admin.disconnect();
  const committedAtStart = {};
  for (const p of fetched.partitions) committedAtStart[p.partition] = Number(p.offset);

  const consumer = kafka.consumer({ groupId: group });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const records = [];
  const next = {}; // partition -> offset after the last record processed
  const committed = {};
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  const complete = () => Object.entries(end).every(([p, e]) => (next[p] ?? committedAtStart[p] ?? 0) >= e);

  await consumer.run({
    autoCommit: false,
    eachBatch: async ({ batch, heartbeat, isRunning, isStale }) => {
      let stop = false;
      for (const m of batch.messages) {
        if (!isRunning() || isStale()) return;
        if (stopAfter >= 0 && records.length >= stopAfter) { stop = true; break; }
        records.push([batch.partition, Number(m.offset), m.key && m.key.toString(), m.value && m.value.toString()]);
        next[batch.partition] = Number(m.offset) + 1;
      }
      if (next[batch.partition] !== undefined && committed[batch.partition] !== next[batch.partition]) {
        await consumer.commitOffsets([{ topic, partition: batch.partition, offset: String(next[batch.partition]) }]);
        committed[batch.partition] = next[batch.partition];
      }
      await heartbeat();
      if (stop || (stopAfter >= 0 && records.length >= stopAfter) || (stopAfter < 0 && complete())) done();
    },
  });
  if (stopAfter < 0 && complete()) done(); // nothing left to read
  await finished;
  await consumer.disconnect();
  return { committed_at_start: committedAtStart, records, committed };
});
