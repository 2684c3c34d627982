// What a watch stream (Jobs.WatchJob, Experiments.WatchExperiment) says
// before its first event: tallyd sends this initial-metadata key (value
// "1") as soon as it has admitted the stream, so a client knows the stream
// is established even when nothing happens for a long time (a queued job,
// an idle experiment), and can tell a stream that is up from one still
// connecting.
#ifndef TALLY_COMMON_WATCH_METADATA_H_
#define TALLY_COMMON_WATCH_METADATA_H_

namespace tally {

inline constexpr char kWatchEstablishedKey[] = "tally-watch-established";

}  // namespace tally

#endif  // TALLY_COMMON_WATCH_METADATA_H_
