#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/build_info.h"
#include "server/metrics/grpc_metrics.h"
#include "server/metrics/http_exporter.h"
#include "server/metrics/registry.h"
#include "server/metrics/text_serializer.h"

namespace tally::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TextSerializerTest, CounterAndGaugeWithHelpAndType) {
  Registry r;
  auto& c = BuildCounter().Name("tally_requests_total").Help("Requests.").Register(r);
  c.Add({{"method", "SubmitJob"}, {"code", "OK"}}).Increment(3);
  auto& g = BuildGauge().Name("tally_queue_depth").Help("Queued jobs.").Register(r);
  g.Add({}).Set(7);
  const std::string text = SerializeText(r.Collect());
  EXPECT_EQ(text,
            "# HELP tally_requests_total Requests.\n"
            "# TYPE tally_requests_total counter\n"
            "tally_requests_total{code=\"OK\",method=\"SubmitJob\"} 3\n"
            "# HELP tally_queue_depth Queued jobs.\n"
            "# TYPE tally_queue_depth gauge\n"
            "tally_queue_depth 7\n");
}

TEST(TextSerializerTest, EscapesLabelValuesAndHelp) {
  Registry r;
  auto& g = BuildGauge().Name("x").Help("line1\nback\\slash").Register(r);
  g.Add({{"path", "a\"b\\c\nd"}}).Set(1);
  const std::string text = SerializeText(r.Collect());
  EXPECT_THAT(text, HasSubstr("# HELP x line1\\nback\\\\slash\n"));
  EXPECT_THAT(text, HasSubstr("x{path=\"a\\\"b\\\\c\\nd\"} 1\n"));
}

TEST(TextSerializerTest, HistogramIsCumulativeWithInf) {
  Registry r;
  auto& h = BuildHistogram().Name("wait_seconds").Help("Wait.").Register(r);
  auto& m = h.Add({}, Histogram::BucketBoundaries{1, 5});
  m.Observe(0.5);
  m.Observe(1);  // on the bound: counted in le="1"
  m.Observe(3);
  m.Observe(100);
  const std::string text = SerializeText(r.Collect());
  EXPECT_THAT(text, HasSubstr("wait_seconds_bucket{le=\"1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("wait_seconds_bucket{le=\"5\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("wait_seconds_bucket{le=\"+Inf\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("wait_seconds_sum 104.5\n"));
  EXPECT_THAT(text, HasSubstr("wait_seconds_count 4\n"));
}

TEST(RegistryTest, SameLabelsAreOneSeries) {
  Registry r;
  auto& c = BuildCounter().Name("c_total").Help("h").Register(r);
  c.Add({{"a", "1"}}).Increment();
  c.Add({{"a", "1"}}).Increment();
  auto families = r.Collect();
  ASSERT_EQ(families.size(), 1u);
  ASSERT_EQ(families[0].metric.size(), 1u);
  EXPECT_EQ(families[0].metric[0].value, 2);
}

TEST(RegistryTest, RemoveDropsTheSeries) {
  Registry r;
  auto& g = BuildGauge().Name("g").Help("h").Register(r);
  Gauge& one = g.Add({{"job", "jobs/1"}});
  g.Add({{"job", "jobs/2"}});
  g.Remove(&one);
  EXPECT_FALSE(g.Has({{"job", "jobs/1"}}));
  EXPECT_THAT(SerializeText(r.Collect()), Not(HasSubstr("jobs/1")));
}

TEST(RegistryTest, CountersIgnoreNegativeIncrements) {
  Counter c;
  c.Increment(2);
  c.Increment(-5);
  EXPECT_EQ(c.Value(), 2);
}

TEST(RegistryTest, CollectCallbacksRunFirst) {
  Registry r;
  auto& g = BuildGauge().Name("g").Help("h").Register(r);
  Gauge& m = g.Add({});
  int calls = 0;
  r.AddCollectCallback([&] { m.Set(++calls); });
  EXPECT_EQ(r.Collect()[0].metric[0].value, 1);
  EXPECT_EQ(r.Collect()[0].metric[0].value, 2);
}

TEST(RegistryDeathTest, DuplicateFamilyAborts) {
  Registry r;
  BuildGauge().Name("dup").Help("h").Register(r);
  EXPECT_DEATH(BuildCounter().Name("dup").Help("h").Register(r), "twice");
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

TEST(HttpExporterTest, ServesMetricsOnAPickedPort) {
  Registry r;
  BuildGauge().Name("tally_up").Help("Up.").Register(r).Add({}).Set(1);
  auto exporter = HttpExporter::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  ASSERT_GT((*exporter)->port(), 0);
  const std::string resp = HttpGet((*exporter)->port(), "/metrics");
  EXPECT_THAT(resp, HasSubstr("200 OK"));
  EXPECT_THAT(resp, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(resp, HasSubstr("\r\n\r\n# HELP tally_up Up.\n"));
  EXPECT_THAT(HttpGet((*exporter)->port(), "/healthz"), HasSubstr("ok"));
  // Not ready until its owner says so (a standby tallyd never does).
  EXPECT_THAT(HttpGet((*exporter)->port(), "/readyz"), HasSubstr("503 Service Unavailable"));
  (*exporter)->SetReady(true);
  EXPECT_THAT(HttpGet((*exporter)->port(), "/readyz"), HasSubstr("200 OK"));
}

// /readyz goes 503 with the check's reason while it gives one (the store
// refusing writes) and back to 200 when it stops.
TEST(HttpExporterTest, ReadinessCheckMakesReadyzNotReadyWithTheReason) {
  Registry registry;
  auto exporter = HttpExporter::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  std::optional<std::string> failing = "the store refuses writes: database or disk is full";
  absl::Mutex mu;
  (*exporter)->SetReadinessCheck([&]() -> std::optional<std::string> {
    absl::MutexLock lock(&mu);
    return failing;
  });
  (*exporter)->SetReady(true);
  const std::string down = HttpGet((*exporter)->port(), "/readyz");
  EXPECT_THAT(down, HasSubstr("503 Service Unavailable"));
  EXPECT_THAT(down, HasSubstr("not ready: the store refuses writes: database or disk is full"));
  {
    absl::MutexLock lock(&mu);
    failing.reset();
  }
  EXPECT_THAT(HttpGet((*exporter)->port(), "/readyz"), HasSubstr("200 OK"));
  (*exporter)->SetReady(false);  // draining wins over a passing check
  EXPECT_THAT(HttpGet((*exporter)->port(), "/readyz"), HasSubstr("503 Service Unavailable"));
  EXPECT_EQ((*exporter)->Readiness().first, 503);
}

TEST(GrpcServerMetricsTest, EveryMethodAndCodeExistsAtZero) {
  Registry r;
  GrpcServerMetrics m(&r);
  m.AddMethod("/tally.v1.Jobs/GetJob", "unary");
  m.AddMethod("/tally.v1.Workers/Connect", "bidi_stream");
  const std::string text = SerializeText(r.Collect());
  EXPECT_THAT(text, HasSubstr("grpc_server_handled_total{grpc_code=\"NotFound\","
                              "grpc_method=\"GetJob\",grpc_service=\"tally.v1.Jobs\","
                              "grpc_type=\"unary\"} 0"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handled_total{grpc_code=\"Unauthenticated\","
                              "grpc_method=\"Connect\",grpc_service=\"tally.v1.Workers\","
                              "grpc_type=\"bidi_stream\"} 0"));
  EXPECT_THAT(text, HasSubstr("grpc_server_started_total{grpc_method=\"Connect\","
                              "grpc_service=\"tally.v1.Workers\",grpc_type=\"bidi_stream\"} 0"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handling_seconds_count{grpc_method=\"GetJob\","
                              "grpc_service=\"tally.v1.Jobs\",grpc_type=\"unary\"} 0"));
  // Latency is for unary calls only (a stream's life is not a latency).
  EXPECT_THAT(text, Not(HasSubstr("grpc_server_handling_seconds_count{grpc_method=\"Connect\"")));
  size_t handled = 0;
  for (size_t at = 0; (at = text.find("\ngrpc_server_handled_total{", at)) != std::string::npos;
       ++at) {
    ++handled;
  }
  EXPECT_EQ(handled, 2u * 17u);
}

TEST(GrpcServerMetricsTest, CountsCallsMessagesAndCodes) {
  Registry r;
  GrpcServerMetrics m(&r);
  auto unary = m.Started("/tally.v1.Jobs/GetJob", "unary");
  unary.received->Increment();
  unary.sent->Increment();
  m.Handled(unary, 5, 0.003);
  auto stream = m.Started("tally.v1.Workers/Connect", "bidi_stream");
  for (int i = 0; i < 3; ++i) stream.received->Increment();
  m.Handled(stream, 1, 120);
  auto odd = m.Started("nonsense", "unary");
  m.Handled(odd, 99, 0);
  const std::string text = SerializeText(r.Collect());
  EXPECT_THAT(text, HasSubstr("grpc_server_handled_total{grpc_code=\"NotFound\","
                              "grpc_method=\"GetJob\",grpc_service=\"tally.v1.Jobs\","
                              "grpc_type=\"unary\"} 1"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handling_seconds_bucket{grpc_method=\"GetJob\","
                              "grpc_service=\"tally.v1.Jobs\",grpc_type=\"unary\",le=\"0.005\"} 1"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handled_total{grpc_code=\"Canceled\","
                              "grpc_method=\"Connect\",grpc_service=\"tally.v1.Workers\","
                              "grpc_type=\"bidi_stream\"} 1"));
  EXPECT_THAT(text, HasSubstr("grpc_server_msg_received_total{grpc_method=\"Connect\","
                              "grpc_service=\"tally.v1.Workers\",grpc_type=\"bidi_stream\"} 3"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handled_total{grpc_code=\"Unknown\","
                              "grpc_method=\"nonsense\",grpc_service=\"unknown\""));
  EXPECT_STREQ(GrpcServerMetrics::CodeName(0), "OK");
  EXPECT_STREQ(GrpcServerMetrics::CodeName(4), "DeadlineExceeded");
  EXPECT_STREQ(GrpcServerMetrics::CodeName(16), "Unauthenticated");
  EXPECT_STREQ(GrpcServerMetrics::CodeName(-1), "Unknown");
}

TEST(BuildInfoTest, NamesVersionAndRevision) {
  Registry r;
  RegisterBuildInfo(&r);
  const std::string text = SerializeText(r.Collect());
  EXPECT_THAT(text, HasSubstr("# TYPE tally_build_info gauge"));
  EXPECT_THAT(text, HasSubstr(std::string("tally_build_info{revision=\"") + BuildRevision() +
                              "\",version=\"" + BuildVersion() + "\"} 1"));
  EXPECT_STRNE(BuildVersion(), "unknown");
}

}  // namespace
}  // namespace tally::metrics
