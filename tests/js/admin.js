// node admin.js BOOTSTRAP create TOPIC PARTITIONS REPLICATION_FACTOR
// node admin.js BOOTSTRAP list
// node admin.js BOOTSTRAP offsets TOPIC
// node admin.js BOOTSTRAP configs TOPIC
// node admin.js BOOTSTRAP grow TOPIC COUNT
//
// kafkajs' admin client. `create` prints {"created": createTopics' answer (true, or false
// when the topic already exists)} after waiting for every partition's leader; `list` prints
// {"topics": listTopics()}; `offsets` prints {"offsets": fetchTopicOffsets(TOPIC)}, each
// partition's low and high watermark; `configs` prints {"configs": describeConfigs' entries
// for the topic (name, value, isDefault)}; `grow` prints {"grown": true} once
// createPartitions has raised the topic to COUNT partitions.
'use strict';
const { ConfigResourceTypes } = require('kafkajs');
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
    if (cmd === 'configs') {
      const { resources } = await admin.describeConfigs({
        resources: [{ type: ConfigResourceTypes.TOPIC, name: args[0] }],
        includeSynonyms: false,
      });
      const [r] = resources;
      if (r.errorCode !== 0) throw new Error(`describeConfigs: error ${r.errorCode} ${r.errorMessage}`);
      return {
        configs: r.configEntries.map((e) => ({
          name: e.configName, value: e.configValue, isDefault: e.isDefault,
        })),
      };
    }
    if (cmd === 'grow') {
      const [topic, count] = args;
      // createPartitions resolves with nothing, and rejects on any error.
      await admin.createPartitions({
        topicPartitions: [{ topic, count: Number(count) }],
        validateOnly: false,
      });
      return { grown: true };
    }
    throw new Error(`unknown command ${cmd} (create, list, offsets, configs, grow)`);
  } finally {
    await admin.disconnect();
  }
});
