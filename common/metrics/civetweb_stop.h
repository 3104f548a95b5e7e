// Stopping a civetweb server without its idle wait. civetweb 1.15's mg_stop
// waits for the listening thread, which polls its sockets with a 2 s timeout
// and looks at the stop flag only when the poll returns: an idle server took
// up to 2 s to stop, and every moesh process (its /metrics endpoint, the
// router's HTTP API) took that long to exit.
#ifndef MOESH_COMMON_METRICS_CIVETWEB_STOP_H_
#define MOESH_COMMON_METRICS_CIVETWEB_STOP_H_

#include <functional>
#include <string>

namespace moesh {

// Runs `stop` (which calls mg_stop, directly or through a destructor) while
// a helper thread connects to `port` every 5 ms (on `host`; the loopback
// for an empty or wildcard host), each connection waking the listening
// thread's poll. A connection made before the stop flag is set is served as
// an empty request and closed. port <= 0: just `stop`.
void StopCivetweb(const std::string& host, int port, const std::function<void()>& stop);

// The host part of a "host:port" listen address ("" for ":port").
std::string ListenHost(const std::string& listen);

}  // namespace moesh

#endif  // MOESH_COMMON_METRICS_CIVETWEB_STOP_H_
