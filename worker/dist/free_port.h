// For tests: a TCP port on 127.0.0.1 that nothing listens on right now.
#ifndef TALLY_WORKER_DIST_FREE_PORT_H_
#define TALLY_WORKER_DIST_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tally::dist {

inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace tally::dist

#endif  // TALLY_WORKER_DIST_FREE_PORT_H_
