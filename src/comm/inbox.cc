// Tagged messages on their way in (comm/inbox.h).
#include "comm/inbox.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>

namespace loom {

using transport::kMessageBody;
using transport::kMessageHead;
using transport::kScheduleData;

void Inbox::resize(int nranks) { reading_.assign(static_cast<size_t>(nranks), Reading{}); }

void Inbox::mismatch(Want* w, int peer, size_t bytes) {
  w->error = LOOM_ERROR(loomInvalidUsage,
                        "rank " + std::to_string(peer) + " sent a message of " +
                            std::to_string(bytes) + " bytes tagged " + std::to_string(w->tag) +
                            " to a receive of " + std::to_string(w->bytes) +
                            " bytes; do the send's and the receive's counts and types match?");
  w->source = peer;
  w->done = true;
}

void Inbox::finish(Want* w, std::list<Stored>::iterator s) {
  w->from = stored_.end();
  if (s->data.size() != w->bytes) {
    mismatch(w, s->peer, s->data.size());
  } else {
    if (w->bytes > 0) std::memcpy(w->buf, s->data.data(), w->bytes);
    w->source = s->peer;
    w->done = true;
  }
  stored_.erase(s);
}

void Inbox::post(Want* w) {
  w->done = false;
  w->matched = false;
  w->from = stored_.end();
  w->source = -1;
  w->error = Status::ok();
  for (auto it = stored_.begin(); it != stored_.end(); ++it) {
    if (it->want != nullptr || it->tag != w->tag) continue;
    if (w->peer != kAnySource && w->peer != it->peer) continue;
    w->matched = true;
    w->source = it->peer;
    if (it->whole()) {
      finish(w, it);
    } else {
      it->want = w;
      w->from = it;
    }
    break;
  }
  wants_.push_back(w);
}

void Inbox::unpost(Want* w) {
  wants_.erase(std::remove(wants_.begin(), wants_.end(), w), wants_.end());
  if (w->from != stored_.end()) {  // matched to a stored message still arriving
    w->from->want = nullptr;       // it waits for a later receive
    w->from = stored_.end();
  }
  for (size_t peer = 0; peer < reading_.size(); ++peer) {
    Reading& r = reading_[peer];
    if (r.want != w) continue;
    if (w->done) {  // failed while its message arrived: the rest of it is read and dropped
      r.want = nullptr;
      r.discard = true;
      continue;
    }
    // Half of its message is in w's buffer: the rest goes to the store, with what came so far.
    Stored s;
    s.peer = static_cast<int>(peer);
    s.tag = w->tag;
    s.data.resize(r.at + r.left);
    if (r.at > 0) std::memcpy(s.data.data(), w->buf, r.at);
    s.filled = r.at;
    stored_.push_back(std::move(s));
    r.stored = std::prev(stored_.end());
    r.want = nullptr;
  }
}

bool Inbox::finishStored() {
  bool any = false;
  for (auto it = stored_.begin(); it != stored_.end();) {
    auto next = std::next(it);
    if (it->want != nullptr && it->whole()) {
      finish(it->want, it);
      any = true;
    }
    it = next;
  }
  return any;
}

Inbox::Want* Inbox::claim(int peer, int tag, size_t bytes, bool* mismatched) {
  *mismatched = false;
  for (Want* w : wants_) {
    if (w->matched || w->done || w->tag != tag) continue;
    if (w->peer != kAnySource && w->peer != peer) continue;
    w->matched = true;
    w->from = stored_.end();
    w->source = peer;
    if (w->bytes == bytes) return w;
    mismatch(w, peer, bytes);
    *mismatched = true;
    return nullptr;
  }
  return nullptr;
}

void Inbox::begin(Reading& r, int peer, int tag, size_t bytes) {
  r = Reading{};
  r.left = bytes;
  r.want = claim(peer, tag, bytes, &r.discard);
  if (r.want != nullptr || r.discard) return;
  Stored s;
  s.peer = peer;
  s.tag = tag;
  s.data.resize(bytes);
  stored_.push_back(std::move(s));
  r.stored = std::prev(stored_.end());
}

Result<size_t> Inbox::absorb(transport::Connection* c, int peer) {
  Reading& r = reading_[static_cast<size_t>(peer)];
  size_t taken = 0;
  auto broken = [&](const std::string& what) {
    return LOOM_ERROR(loomInternalError, "rank " + std::to_string(peer) + "'s connection: " + what +
                                             " (do both ranks run the same version of Loom?)");
  };
  for (;;) {
    size_t got = 0;
    const void* slot = c->tryRecvSlot(&got);
    if (slot == nullptr) break;
    const transport::Stamp st = c->recvStamp();
    if (st.message == kScheduleData) {
      if (r.left > 0) return broken("a message ended early");
      break;
    }
    if (st.message == kMessageHead) {
      if (r.left > 0) return broken("a message began inside another");
      begin(r, peer, st.tag, st.messageBytes);
    } else if (st.message != kMessageBody || r.left == 0) {
      return broken("a message's slot came without its head");
    }
    if (got > r.left) return broken("a message's slot ran past its end");
    if (got > 0) {
      if (r.want != nullptr)
        std::memcpy(r.want->buf + r.at, slot, got);
      else if (!r.discard)
        std::memcpy(r.stored->data.data() + r.at, slot, got);
    }
    r.at += got;
    r.left -= got;
    if (r.want == nullptr && !r.discard) r.stored->filled = r.at;
    c->releaseRecv();
    ++taken;
    if (r.left == 0) {  // whole
      if (r.want != nullptr) {
        r.want->done = true;
      } else if (!r.discard && r.stored->want != nullptr) {
        finish(r.stored->want, r.stored);
      }
      r = Reading{};
    }
  }
  return taken;
}

void Inbox::deliverLocal(int self, int tag, const char* data, size_t bytes) {
  bool mismatched = false;
  if (Want* w = claim(self, tag, bytes, &mismatched)) {
    if (bytes > 0) std::memcpy(w->buf, data, bytes);
    w->done = true;
    return;
  }
  if (mismatched) return;  // the receive failed; the message is dropped
  Stored s;
  s.peer = self;
  s.tag = tag;
  s.data.assign(data, data + bytes);
  s.filled = bytes;
  stored_.push_back(std::move(s));
}

bool Inbox::messageAtHead(transport::Connection* c) {
  size_t got = 0;
  return c->tryRecvSlot(&got) != nullptr && c->recvStamp().message != kScheduleData;
}

}  // namespace loom
