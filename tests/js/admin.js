// node admin.js BOOTSTRAP create TOPIC PARTITIONS REPLICATION_FACTOR
// node admin.js BOOTSTRAP list
// node admin.js BOOTSTRAP offsets TOPIC
//
// kafkajs' admin client. `create` prints {"created": createTopics' answer (true, or false
// when the topic already exists)} after waiting for every partition's leader; `list` prints
// {"topics": listTopics()}; `offsets` prints {"offsets": fetchTopicOffsets(TOPIC)}, each
// partition's low and high watermark.
'use strict';
const { client, main } = require('./common');

const [bootstrap, cmd, ...args] = process.argv.slice(2);

main(async () => {
  const admin = client(bootstrap, 'kiln-test-admin').admin();
  await admin.connect();
  try {
    if (cmd === 'create') {
      const [topic, partitions, rf] = args;
      const created = await admin.createTopics({
        topics: [{ topic, numPartitions: Number(partitions), replicationFactor: Number(rf) }],
        waitForLeaders: true,
      });
      return { created };
    }
    if (cmd === 'list') return { topics: await admin.listTopics() };
    if (cmd === 'offsets') return { offsets: await admin.fetchTopicOffsets(args[0]) };
    throw new Error(`unknown command ${cmd} (create, list, offsets)`);
  } finally {
    await admin.disconnect();
  }
});
