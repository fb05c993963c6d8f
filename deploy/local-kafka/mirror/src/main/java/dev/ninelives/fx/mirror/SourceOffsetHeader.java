/*
 * A Single Message Transform for MirrorMaker 2's MirrorSourceConnector (fx mirror).
 *
 * MirrorMaker 2 copies each record's key, value, headers and timestamp, but the target broker
 * gives it a new offset: the site's transaction markers (every lease holder transaction ends
 * with one) and aborted records take offsets on the site that the copy never sees, and the
 * mirror's own transactions (exactly.once.source.support=enabled) put markers of their own on
 * the fleet. Records of this project name each other by offset (merge entries, snapshot
 * positions, request offsets), so the copy carries each record's site offset in a header,
 * "fx.mirror.offset" (ASCII decimal), and the project's one partition reader
 * (fx_kafka.client.read_partition) reports it as the record's offset. A record that already
 * carries the header (a copy of a copy) keeps it: the offset is always the origin's.
 *
 * "fx.mirror.site" names the source cluster alias the record was copied from. The first record
 * this transform copies from a partition also carries "fx.mirror.log_start": the site's log start
 * offset of that partition when fx mirror started (config "log.starts"), so that a reader of the
 * copy knows where the site's log began (a topic whose first offsets are aborted transactions or
 * were trimmed does not begin at its first record).
 */
package dev.ninelives.fx.mirror;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.header.Headers;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.transforms.Transformation;

public class SourceOffsetHeader implements Transformation<SourceRecord> {

    /** Must equal fx_kafka.client.MIRROR_OFFSET_HEADER (a unit test checks). */
    public static final String OFFSET_HEADER = "fx.mirror.offset";
    /** Must equal fx_kafka.client.MIRROR_SITE_HEADER (a unit test checks). */
    public static final String SITE_HEADER = "fx.mirror.site";
    /** Must equal fx_kafka.client.MIRROR_LOG_START_HEADER (a unit test checks). */
    public static final String LOG_START_HEADER = "fx.mirror.log_start";
    public static final String SITE_CONFIG = "site";
    public static final String LOG_STARTS_CONFIG = "log.starts";

    private static final ConfigDef CONFIG = new ConfigDef()
            .define(SITE_CONFIG, ConfigDef.Type.STRING, "", ConfigDef.Importance.MEDIUM,
                    "the site's cluster alias, written in the fx.mirror.site header")
            .define(LOG_STARTS_CONFIG, ConfigDef.Type.LIST, List.of(), ConfigDef.Importance.MEDIUM,
                    "TOPIC:PARTITION=OFFSET for each mirrored partition: the site's log start");

    private byte[] site = new byte[0];
    private final Map<String, Long> logStarts = new HashMap<>();
    private final Set<String> marked = new HashSet<>();

    @Override
    public void configure(Map<String, ?> configs) {
        Object value = configs.get(SITE_CONFIG);
        site = (value == null ? "" : value.toString()).getBytes(StandardCharsets.UTF_8);
        Object starts = configs.get(LOG_STARTS_CONFIG);
        if (starts != null) {
            for (Object item : ConfigDef.parseType(LOG_STARTS_CONFIG, starts, ConfigDef.Type.LIST)
                    instanceof List<?> list ? list : List.of()) {
                String text = item.toString().trim();
                int eq = text.lastIndexOf('=');
                if (eq <= 0) {
                    throw new IllegalArgumentException("log.starts: not TOPIC:PARTITION=OFFSET: " + text);
                }
                logStarts.put(text.substring(0, eq), Long.parseLong(text.substring(eq + 1)));
            }
        }
    }

    @Override
    public SourceRecord apply(SourceRecord record) {
        if (record.headers().lastWithName(OFFSET_HEADER) != null) {
            return record;  // a copy of a copy: the origin's offset stays
        }
        Map<String, ?> sourceOffset = record.sourceOffset();
        Object offset = sourceOffset == null ? null : sourceOffset.get("offset");
        if (!(offset instanceof Number)) {
            throw new IllegalStateException("SourceOffsetHeader: record for " + record.topic()
                    + " has no numeric source offset (not a MirrorSourceConnector record?): "
                    + sourceOffset);
        }
        long siteOffset = ((Number) offset).longValue();
        Headers headers = record.headers().duplicate();
        headers.addBytes(OFFSET_HEADER, ascii(siteOffset));
        if (site.length > 0) {
            headers.addBytes(SITE_HEADER, site);
        }
        Map<String, ?> partition = record.sourcePartition();
        String key = (partition == null ? record.topic() : String.valueOf(partition.get("topic")))
                + ":" + (partition == null ? record.kafkaPartition() : partition.get("partition"));
        if (marked.add(key)) {
            Long start = logStarts.get(key);
            if (start != null && start <= siteOffset) {
                headers.addBytes(LOG_START_HEADER, ascii(start));
            }
        }
        return record.newRecord(record.topic(), record.kafkaPartition(), record.keySchema(),
                record.key(), record.valueSchema(), record.value(), record.timestamp(), headers);
    }

    private static byte[] ascii(long value) {
        return Long.toString(value).getBytes(StandardCharsets.US_ASCII);
    }

    @Override
    public ConfigDef config() {
        return CONFIG;
    }

    @Override
    public void close() {
    }
}
