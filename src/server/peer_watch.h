// Whether the client of a request still waits for its answer. httplib hands a handler no socket,
// so the socket is found by its addresses (the request's local and remote ports), once, and then
// watched: a client that closed its end (or reset it) is gone; one that sent more (a pipelined
// request) is not.
#pragma once

#include <httplib.h>

namespace sluice::server {

class PeerWatch {
 public:
  explicit PeerWatch(const httplib::Request& req);
  // False when the socket was not found: then nothing is known, and gone() stays false.
  bool found() const { return socket_ >= 0; }
  bool gone() const;

 private:
  int socket_ = -1;
};

}  // namespace sluice::server
