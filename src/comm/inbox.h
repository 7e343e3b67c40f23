// Tagged messages on their way in (exec/messages.h): receives waiting for a message, and the
// messages that arrived before a receive asked for them.
//
// A message shares its connection with schedules' data, slot by slot, marked in the slot's
// stamp (transport::kMessageHead, kMessageBody). Whoever reads a connection hands the message
// slots at its head to the inbox (absorb()) and reads only a schedule's slots itself: the
// executor while a collective or a group of sends and receives runs, the message engine while
// receives wait. So a message sent before its receiver reaches the matching receive (an isend
// ahead of a collective, a message for a later tag) never lands in a schedule's buffers.
//
// Matching, as MPI's: a receive takes the earliest message from its peer (or from any peer)
// with its tag; two messages from one peer with one tag arrive in the order they were sent.
// A message no receive is waiting for is copied into memory of its own (the store) and given
// to the first receive that matches it later.
//
// Used under the communicator's operation lock, by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

#include "trace/recorder.h"
#include "transport/transport.h"
#include "util/status.h"

namespace loom {

class Inbox {
  struct Stored;

 public:
  static constexpr int kAnySource = -1;

  // A receive waiting for its message: posted (post()) until done, then unposted.
  struct Want {
    int peer = kAnySource;
    int tag = 0;
    char* buf = nullptr;
    size_t bytes = 0;
    bool done = false;
    int source = -1;       // the sender, once matched
    Status error;          // done with this error: the message that matched was of another size
    bool matched = false;  // its message is on its way (or stored, still arriving)
    std::list<Stored>::iterator from;  // that stored message, when it is one
  };

  // A receive of a message run (exec/messages.h), with what it needs once its operation has
  // ended before its message came (a non-blocking communicator's receive, kept()): its ticket,
  // its record and its deadline.
  struct Receive {
    Want want;
    int* source = nullptr;  // where the sender's rank goes (may be null)
    uint64_t ticket = 0;    // the worker's ticket, once kept
    uint64_t seq = 0;
    trace::OpRecord* record = nullptr;
    int64_t deadlineNs = 0;
  };

  void resize(int nranks);
  // Receives still waiting after their operation ended, in the order they were posted.
  std::list<Receive>& kept() { return kept_; }

  // Registers a receive. It takes the earliest stored message that matches, finishing at once
  // when that one is whole; else the next matching message that arrives, in post order among
  // the wants.
  void post(Want* w);
  // Takes a want back, done or given up (the bytes of a message already read into one given up
  // go on into the store, so that the connection stays in step).
  void unpost(Want* w);
  // Finishes the wants matched to stored messages that have become whole; true when one did.
  bool finishStored();

  // Takes every message slot at the head of c (the connection from `peer`) into the wants or the
  // store. Returns how many slots it took; fails when a slot contradicts the messages' framing.
  Result<size_t> absorb(transport::Connection* c, int peer);
  // A message this rank sends itself: matched or stored at once.
  void deliverLocal(int self, int tag, const char* data, size_t bytes);

  // Whether the head of c is a message's slot (absorb() would take it).
  static bool messageAtHead(transport::Connection* c);

 private:
  struct Stored {
    int peer = -1;
    int tag = 0;
    std::vector<char> data;
    size_t filled = 0;
    Want* want = nullptr;  // matched while still arriving
    bool whole() const { return filled == data.size(); }
  };
  // Where the rest of the message being read from one peer goes: a want, a stored message, or
  // nowhere (a message of the wrong size for the want it matched).
  struct Reading {
    size_t left = 0;  // bytes still to come; 0: no message is being read
    size_t at = 0;    // bytes read so far
    Want* want = nullptr;
    std::list<Stored>::iterator stored;
    bool discard = false;
  };

  // The first posted want for a message of `bytes` from `peer` tagged `tag`, now matched to it;
  // null when none waits, or when the first that matches is of another size (then failed, and
  // *mismatched set).
  Want* claim(int peer, int tag, size_t bytes, bool* mismatched);
  // Starts reading a message whose head came from `peer`.
  void begin(Reading& r, int peer, int tag, size_t bytes);
  // Copies a whole stored message into w, ends w and drops the message.
  void finish(Want* w, std::list<Stored>::iterator s);
  // Fails w for a message of `bytes` bytes from `peer`.
  static void mismatch(Want* w, int peer, size_t bytes);

  std::list<Stored> stored_;  // in arrival order
  std::vector<Want*> wants_;  // in post order
  std::list<Receive> kept_;
  std::vector<Reading> reading_;
};

}  // namespace loom
