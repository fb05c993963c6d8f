#!/bin/sh
# Renders the broker config from the template (the placeholders fx_kafka.local_storage fills for
# one node), formats the storage once (a restarted container keeps its cluster id and logs), then
# runs the broker in the foreground.
set -eu
data=/var/lib/kafka
props="$data/server.properties"
cp="/opt/kafka/lib/*"
java_base() {
  java -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties -Dkafka.logs.dir="$data" -cp "$cp" "$@"
}
sed -e "s#\${node_id}#1#g" -e "s#\${port}#${KAFKA_PORT}#g" \
    -e "s#\${controller_port}#${KAFKA_CONTROLLER_PORT}#g" -e "s#\${log_dir}#$data/logs#g" \
    -e "s#\${quorum}#controller.quorum.bootstrap.servers=127.0.0.1:${KAFKA_CONTROLLER_PORT}#g" \
    -e "s#\${replication_factor}#1#g" -e "s#\${min_isr}#1#g" \
    /opt/kafka/server.properties.template >"$props"
if [ ! -f "$data/logs/meta.properties" ]; then
  id="$(java_base kafka.tools.StorageTool random-uuid | tail -1)"
  java_base kafka.tools.StorageTool format --standalone -t "$id" -c "$props" >/dev/null
  echo "kafka: formatted $data/logs (cluster $id)"
fi
echo "kafka: broker on 127.0.0.1:${KAFKA_PORT}, controller on ${KAFKA_CONTROLLER_PORT}"
exec java "-Xms${KAFKA_HEAP}" "-Xmx${KAFKA_HEAP}" -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties -Dkafka.logs.dir="$data" \
  -cp "$cp" kafka.Kafka "$props"
