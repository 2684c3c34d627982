// GrpcServerMetrics: gRPC server metrics in the grpc-prometheus convention
// (github.com/grpc-ecosystem/go-grpc-prometheus), so its dashboards and
// alerts work unchanged:
//   grpc_server_started_total{grpc_service,grpc_method,grpc_type}
//   grpc_server_handled_total{grpc_service,grpc_method,grpc_type,grpc_code}
//   grpc_server_msg_received_total, grpc_server_msg_sent_total
//   grpc_server_handling_seconds{grpc_service,grpc_method,grpc_type}
//     (histogram, unary calls only)
// grpc_type is unary, client_stream, server_stream or bidi_stream; grpc_code
// is the code's name as grpc-go writes it (OK, Canceled, NotFound, ...).
//
// It knows nothing of gRPC's C++ API (only server/api includes grpcpp): the
// interceptor there calls it with a method's full name ("/pkg.Service/Method"),
// its type and the status code's number.
//
// Thread-safety: thread-safe.
#ifndef TALLY_SERVER_METRICS_GRPC_METRICS_H_
#define TALLY_SERVER_METRICS_GRPC_METRICS_H_

#include <string>

#include "server/metrics/registry.h"

namespace tally::metrics {

class GrpcServerMetrics {
 public:
  // One call's series, resolved once when it starts.
  struct Call {
    Labels method;  // grpc_service, grpc_method, grpc_type
    bool unary = false;
    Counter* received = nullptr;
    Counter* sent = nullptr;
  };

  // Registers the families in `registry`, which must outlive this.
  explicit GrpcServerMetrics(Registry* registry);

  // Creates every series of a method at 0, handled for each of the 17 codes,
  // so that the first error of each kind shows in rate() and increase().
  void AddMethod(const std::string& full_method, const std::string& type);
  // Counts a call's start. `full_method` is "/pkg.Service/Method" (the
  // leading slash optional); anything else is counted as service "unknown".
  Call Started(const std::string& full_method, const std::string& type);
  void Handled(const Call& call, int code, double seconds);

  // grpc-go's name of a status code; "Unknown" for a number out of range.
  static const char* CodeName(int code);

 private:
  static Labels MethodLabels(const std::string& full_method, const std::string& type);
  Family<Counter>* started_;
  Family<Counter>* handled_;
  Family<Counter>* received_;
  Family<Counter>* sent_;
  Family<Histogram>* handling_seconds_;
};

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_GRPC_METRICS_H_
