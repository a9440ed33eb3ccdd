// The host device's transport to other nodes over UCX: each rank registers its heap (ucp_mem_map), the ranks
// exchange their workers' addresses and heaps' keys over the bootstrap, and each connects to the PEs of the other
// nodes. The transport is chosen by UCX's own variables (UCX_TLS, UCX_NET_DEVICES).
//
// One worker per rank, used by the calling threads and by a progress thread, serialized by one mutex
// (UCS_THREAD_MODE_SERIALIZED: any UCX build will do). The progress thread is needed: over TCP, a peer's put, get
// and atomic on this rank's heap are carried out by this rank's progress engine, and nothing completes without it.
// It sleeps on the worker's event descriptor between events, so an idle rank costs no core.
//
// Liveness: a second endpoint per PE of another node, in UCX's peer-failure mode (UCP_ERR_HANDLING_MODE_PEER), whose
// error callback marks the PE lost. It carries nothing: the operations go on the first endpoint, in the default
// error mode, since the peer-failure mode makes UCX 1.22 select no emulated atomics over TCP. A peer whose process
// exits or is killed has its connections closed by its kernel; the progress thread sees that at once, marks the PE
// lost and wakes the waiters. A machine that vanishes without closing them is left to the TCP keepalive that UCX sets
// on its sockets (UCX_TCP_KEEP*), or else to the timeout.
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <ucp/api/ucp.h>

#include "runtime/agreement.h"
#include "runtime/host/remote_transport.h"
#include "runtime/logging.h"

namespace hp::shmem::host {

namespace {

using Clock = std::chrono::steady_clock;

// What every rank publishes first: the sizes of its blobs and where its heap lies.
struct PeerHeader {
  std::uint64_t address_bytes;
  std::uint64_t rkey_bytes;
  std::uint64_t heap_base;
  std::uint64_t heap_bytes;
};

std::string UcsText(ucs_status_t status) { return std::string(ucs_status_string(status)); }

class UcxTransport final : public RemoteTransport {
 public:
  explicit UcxTransport(const RemoteTransportArgs& args)
      : args_(args), losses_(std::make_shared<PeerLosses>(args.world_size)) {
    peers_.resize(static_cast<std::size_t>(args_.world_size));
    for (int pe = 0; pe < args_.world_size; ++pe) liveness_args_.push_back({this, pe});
  }
  ~UcxTransport() override { (void)Close(); }

  // Context, worker, the heap's registration and the progress thread: local, never waits. Empty on success, else
  // why UCX cannot serve here.
  std::string Open() {
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) return "reading UCX's configuration failed: " + UcsText(status);
    // PutWithSignal's fence: UCX's default ("auto", with its v2 protocols) fences the whole worker, a flush of every
    // endpoint before the next operation, which costs put_with_signal a second round trip; the endpoint-based mode
    // orders the operations of the one endpoint, which is what the fence must do here. UCX_FENCE_MODE still decides.
    if (std::getenv("UCX_FENCE_MODE") == nullptr && ucp_config_modify(config, "FENCE_MODE", "ep_based") != UCS_OK) {
      HP_LOG(kDebug, "this UCX has no endpoint-based fence mode: put_with_signal's fence is UCX's default");
    }
    // ExchangeMessages' long messages: UCX's default rendezvous ("auto") reads them with a get, which over TCP is
    // emulated by the sender's progress engine and runs at a third of gloo's speed here; the receiver's put request
    // (put_zcopy) runs faster than gloo (docs/multinode.md). UCX_RNDV_SCHEME still decides.
    if (std::getenv("UCX_RNDV_SCHEME") == nullptr && ucp_config_modify(config, "RNDV_SCHEME", "put_zcopy") != UCS_OK) {
      HP_LOG(kDebug, "this UCX has no put_zcopy rendezvous: long messages take UCX's default");
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    // WAKEUP: the worker's event descriptor, on which the progress thread sleeps. TAG: ExchangeMessages.
    params.features =
        UCP_FEATURE_RMA | UCP_FEATURE_AMO32 | UCP_FEATURE_AMO64 | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    status = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (status != UCS_OK) return "ucp_init failed: " + UcsText(status);
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;   // mu_ serializes every use
    status = ucp_worker_create(context_, &worker_params, &worker_);
    if (status != UCS_OK) return "ucp_worker_create failed: " + UcsText(status);
    ucp_mem_map_params_t map{};
    map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    map.address = args_.heap;
    map.length = args_.heap_bytes;
    status = ucp_mem_map(context_, &map, &memh_);
    if (status != UCS_OK) return "registering the heap with UCX failed: " + UcsText(status);
    status = ucp_worker_get_efd(worker_, &worker_fd_);
    if (status != UCS_OK) return "UCX's worker has no event descriptor: " + UcsText(status);
    stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (stop_fd_ < 0) return std::string("eventfd failed: ") + std::strerror(errno);
    progress_ = std::thread([this] { ProgressLoop(); });
    return {};
  }

  std::string name() const override { return "ucx"; }

  Status Connect(Bootstrap& bootstrap) override {
    Status local = Exchange(bootstrap);
    // Where a peer published nothing, its own failure is the agreement's message: the others connect to nobody.
    if (local.ok() && peers_published_) local = ConnectPeers();
    return AgreeOnStatus(bootstrap, local, "connecting to the other nodes over UCX");
  }

  bool reaches(int pe) const override {
    return pe >= 0 && pe < args_.world_size && peers_[static_cast<std::size_t>(pe)].ep != nullptr;
  }

  std::shared_ptr<const PeerLosses> losses() const override { return losses_; }

  Status Put(int pe, std::size_t heap_offset, const void* src, std::size_t bytes) override {
    HP_RETURN_IF_ERROR(CheckRange(pe, heap_offset, bytes, "put"));
    if (bytes == 0) return Status::Ok();
    const Peer& peer = peers_[static_cast<std::size_t>(pe)];
    ucp_request_param_t param{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      ucs_status_ptr_t put = ucp_put_nbx(peer.ep, src, bytes, peer.heap_base + heap_offset, peer.rkey, &param);
      if (UCS_PTR_IS_ERR(put)) return Failure("put", pe, UCS_PTR_STATUS(put));
      if (put != nullptr) ucp_request_free(put);   // the flush below completes it, or reports its failure
    }
    // Remote completion: the bytes are in the peer's heap once the endpoint's flush completes.
    return Flush(pe, "put");
  }

  Status Get(int pe, std::size_t heap_offset, void* dst, std::size_t bytes) override {
    HP_RETURN_IF_ERROR(CheckRange(pe, heap_offset, bytes, "get"));
    if (bytes == 0) return Status::Ok();
    const Peer& peer = peers_[static_cast<std::size_t>(pe)];
    ucp_request_param_t param{};
    ucs_status_ptr_t get;
    {
      std::lock_guard<std::mutex> lock(mu_);
      get = ucp_get_nbx(peer.ep, dst, bytes, peer.heap_base + heap_offset, peer.rkey, &param);
    }
    return Complete(get, "get", pe);
  }

  Status Signal(int pe, std::size_t heap_offset, SignalWidth width, std::int64_t value, SignalOp op) override {
    HP_RETURN_IF_ERROR(CheckRange(pe, heap_offset, static_cast<std::size_t>(width), "signal"));
    ucs_status_ptr_t atomic;
    {
      std::lock_guard<std::mutex> lock(mu_);
      atomic = PostSignal(pe, heap_offset, width, value, op);
    }
    HP_RETURN_IF_ERROR(Complete(atomic, "signal", pe));
    // A posted add completes locally at once: the flush makes it done on the peer before the call returns.
    return op == SignalOp::kAdd ? Flush(pe, "signal") : Status::Ok();
  }

  Status PutWithSignal(int pe, std::size_t heap_offset, const void* src, std::size_t bytes, std::size_t signal_offset,
                       SignalWidth width, std::int64_t value, SignalOp op) override {
    HP_RETURN_IF_ERROR(CheckRange(pe, heap_offset, bytes, "put_with_signal"));
    HP_RETURN_IF_ERROR(CheckRange(pe, signal_offset, static_cast<std::size_t>(width), "put_with_signal"));
    const Peer& peer = peers_[static_cast<std::size_t>(pe)];
    ucp_request_param_t param{};
    ucs_status_ptr_t flush;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bytes > 0) {
        ucs_status_ptr_t put = ucp_put_nbx(peer.ep, src, bytes, peer.heap_base + heap_offset, peer.rkey, &param);
        if (UCS_PTR_IS_ERR(put)) return Failure("put_with_signal", pe, UCS_PTR_STATUS(put));
        if (put != nullptr) ucp_request_free(put);   // the flush below completes it, or reports its failure
        // UCX orders no two operations on an endpoint by itself (the put and the atomic may travel on different
        // lanes): the fence makes the atomic take effect only after the put did, so the peer never sees the new
        // signal before the data.
        const ucs_status_t fenced = ucp_worker_fence(worker_);
        if (fenced != UCS_OK) return Failure("put_with_signal", pe, fenced);
      }
      ucs_status_ptr_t atomic = PostSignal(pe, signal_offset, width, value, op);
      if (UCS_PTR_IS_ERR(atomic)) return Failure("put_with_signal", pe, UCS_PTR_STATUS(atomic));
      if (atomic != nullptr) ucp_request_free(atomic);   // the flush completes it too
      flush = ucp_ep_flush_nbx(peer.ep, &param);
    }
    // One wait: the flush completes once the put and the atomic are done on the peer.
    return Complete(flush, "put_with_signal", pe);
  }

  Status ExchangeMessages(std::uint64_t tag, MessageExchange* exchanges, std::size_t count) override {
    if (tag >> kMessageTagBits != 0) {
      return InvalidArgument("`tag` must be below 2^" + std::to_string(kMessageTagBits) + ", but got " +
                             std::to_string(tag));
    }
    for (std::size_t i = 0; i < count; ++i) {
      HP_RETURN_IF_ERROR(CheckRange(exchanges[i].pe, 0, 0, "exchange_messages"));
    }
    // UCX matches a message by its tag alone: the sender's PE rides in the low bits, so that a receive takes only
    // what its `pe` sent.
    const auto message_tag = [tag](int sender) { return tag << kSenderBits | static_cast<std::uint64_t>(sender); };
    std::vector<PendingMessage> pending;
    pending.reserve(2 * count);   // never moves: UCX holds the address of each receive's `info`
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Every receive first: a message that arrives meanwhile lands in place instead of in UCX's unexpected queue.
      for (std::size_t i = 0; i < count; ++i) {
        MessageExchange& exchange = exchanges[i];
        exchange.status = Status::Ok();
        exchange.received = 0;
        if (exchange.receive == nullptr) continue;
        PendingMessage& receiving = pending.emplace_back(PendingMessage{&exchange, true, nullptr, {}});
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO;
        param.recv_info.tag_info = &receiving.info;
        receiving.request = ucp_tag_recv_nbx(worker_, exchange.receive, exchange.receive_capacity,
                                             message_tag(exchange.pe), ~ucp_tag_t{0}, &param);
      }
      // Every send, even where its receive failed at once (a message already here, longer than the room): the peer
      // waits for it.
      for (std::size_t i = 0; i < count; ++i) {
        MessageExchange& exchange = exchanges[i];
        if (exchange.send == nullptr) continue;
        ucp_request_param_t param{};
        pending.push_back(PendingMessage{
            &exchange, false,
            ucp_tag_send_nbx(peers_[static_cast<std::size_t>(exchange.pe)].ep, exchange.send, exchange.send_bytes,
                             message_tag(args_.rank), &param),
            {}});
      }
    }
    // Every one runs until done or failed: a receive that fails must not leave a send that UCX still reads.
    CompleteAll(pending);
    return Status::Ok();
  }

  Status Close() override {
    // The endpoints first, while the progress thread still serves the peers closing theirs: a close completes once
    // the peer acknowledged everything sent to it (every operation had completed already: each call waits for its
    // own). Bounded: a peer that is gone fails or times out the close, which then releases the endpoint anyway; the
    // endpoints of a PE known lost, and every liveness endpoint (it carries nothing), are released without waiting.
    for (int pe = 0; pe < args_.world_size; ++pe) {
      Peer& peer = peers_[static_cast<std::size_t>(pe)];
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (peer.rkey != nullptr) ucp_rkey_destroy(peer.rkey);   // before its endpoint goes
        peer.rkey = nullptr;
      }
      CloseEndpoint(&peer.ep, /*force=*/Lost(pe));
    }
    // Closing a liveness endpoint makes the peer see this rank lost: only once every operations' endpoint is closed.
    for (Peer& peer : peers_) CloseEndpoint(&peer.live, /*force=*/true);
    if (progress_.joinable()) {
      stopping_.store(true);
      const std::uint64_t one = 1;
      if (write(stop_fd_, &one, sizeof(one)) < 0) HP_LOG(kWarning, "waking UCX's progress thread failed");
      progress_.join();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
    memh_ = nullptr;
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    worker_ = nullptr;
    if (context_ != nullptr) ucp_cleanup(context_);
    context_ = nullptr;
    if (stop_fd_ >= 0) close(stop_fd_);
    stop_fd_ = -1;
    return Status::Ok();
  }

 private:
  struct Peer {
    ucp_ep_h ep = nullptr;     // the operations' endpoint (UCX's default error mode)
    ucp_ep_h live = nullptr;   // the liveness endpoint (peer-failure mode): its failure marks the PE lost
    ucp_rkey_h rkey = nullptr;
    std::uint64_t heap_base = 0;
    std::uint64_t heap_bytes = 0;
  };

  // Every rank's header, then every rank's worker address and packed heap key, padded to the largest. A rank whose
  // UCX failed here still takes part in both gathers, publishing nothing (a zero header), so that nobody waits for it
  // and the failure reaches every rank through Connect's agreement.
  Status Exchange(Bootstrap& bootstrap) {
    Status local = Status::Ok();
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    ucs_status_t status = ucp_worker_query(worker_, &attr);
    const bool have_address = status == UCS_OK;
    if (!have_address) local = DeviceError("querying UCX's worker address failed: status=" + UcsText(status));
    void* rkey = nullptr;
    std::size_t rkey_bytes = 0;
    if (local.ok()) {
      // ucp_rkey_pack, not ucp_memh_pack: the latter packs only exported handles in this UCX.
      status = ucp_rkey_pack(context_, memh_, &rkey, &rkey_bytes);
      if (status != UCS_OK) local = DeviceError("packing the heap's UCX key failed: status=" + UcsText(status));
    }
    const PeerHeader mine = local.ok() ? PeerHeader{attr.address_length, rkey_bytes,
                                                    reinterpret_cast<std::uintptr_t>(args_.heap), args_.heap_bytes}
                                       : PeerHeader{0, 0, 0, 0};
    const auto world = static_cast<std::size_t>(args_.world_size);
    std::vector<PeerHeader> headers(world);
    Status gathered = bootstrap.AllGather(&mine, sizeof(mine), headers.data());
    std::size_t address_slot = 0;
    std::size_t rkey_slot = 0;
    for (const PeerHeader& header : headers) {
      address_slot = std::max<std::size_t>(address_slot, header.address_bytes);
      rkey_slot = std::max<std::size_t>(rkey_slot, header.rkey_bytes);
    }
    const std::size_t slot = address_slot + rkey_slot;
    std::vector<char> blob(slot, 0);
    std::vector<char> blobs(slot * world);
    if (gathered.ok()) {
      if (local.ok()) {
        std::memcpy(blob.data(), attr.address, attr.address_length);
        std::memcpy(blob.data() + address_slot, rkey, rkey_bytes);
      }
      gathered = bootstrap.AllGather(blob.data(), slot, blobs.data());
    }
    if (rkey != nullptr) ucp_rkey_buffer_release(rkey);
    if (have_address) ucp_worker_release_address(worker_, attr.address);
    HP_RETURN_IF_ERROR(gathered);
    HP_RETURN_IF_ERROR(local);
    blobs_ = std::move(blobs);
    address_slot_ = address_slot;
    slot_ = slot;
    for (std::size_t pe = 0; pe < world; ++pe) {
      peers_[pe].heap_base = headers[pe].heap_base;
      peers_[pe].heap_bytes = headers[pe].heap_bytes;
      peers_published_ = peers_published_ && headers[pe].address_bytes > 0;
    }
    return Status::Ok();
  }

  // Endpoints to the PEs of other nodes, each flushed once: the connection is up, or the failure names the PE.
  Status ConnectPeers() {
    const int node = args_.nodes[static_cast<std::size_t>(args_.rank)];
    for (int pe = 0; pe < args_.world_size; ++pe) {
      if (args_.nodes[static_cast<std::size_t>(pe)] == node) continue;
      const char* blob = blobs_.data() + static_cast<std::size_t>(pe) * slot_;
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      params.address = reinterpret_cast<const ucp_address_t*>(blob);
      // Not UCP_ERR_HANDLING_MODE_PEER: UCX (1.22) then selects no emulated atomics, so signals over TCP would fail.
      // A failed connection still fails the requests on it; the liveness endpoint below tells why, at once.
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      Peer& peer = peers_[static_cast<std::size_t>(pe)];
      {
        std::lock_guard<std::mutex> lock(mu_);
        ucp_ep_h ep = nullptr;
        ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
        if (status != UCS_OK) return Failure("connect", pe, status);
        peer.ep = ep;
        status = ucp_ep_rkey_unpack(ep, blob + address_slot_, &peer.rkey);
        if (status != UCS_OK) return Failure("connect", pe, status);
        ucp_ep_params_t liveness = params;
        liveness.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        liveness.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        liveness.err_handler.cb = &UcxTransport::OnLivenessFailure;
        liveness.err_handler.arg = &liveness_args_[static_cast<std::size_t>(pe)];
        status = ucp_ep_create(worker_, &liveness, &peer.live);
        if (status != UCS_OK) return Failure("connect", pe, status);
      }
      HP_RETURN_IF_ERROR(Flush(pe, "connect"));
      HP_RETURN_IF_ERROR(Complete(FlushLiveness(pe), "connect", pe));
    }
    blobs_.clear();
    return Status::Ok();
  }

  // Called by UCX, inside a progress of the worker (under mu_), when the liveness endpoint to a PE fails.
  static void OnLivenessFailure(void* arg, ucp_ep_h /*ep*/, ucs_status_t /*status*/) {
    const auto* which = static_cast<const LivenessArg*>(arg);
    which->transport->MarkLost(which->pe);
  }

  void MarkLost(int pe) {
    if (!losses_->Mark(pe)) return;
    NotifyRemoteWrite();   // waiters look again and see the loss
  }

  // Closes `*ep` (null afterwards): at once when `force`, else flushed first, at most the timeout.
  void CloseEndpoint(ucp_ep_h* ep, bool force) {
    if (*ep == nullptr) return;
    ucs_status_ptr_t closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ucp_request_param_t param{};
      if (force) {
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      }
      closing = ucp_ep_close_nbx(*ep, &param);
      *ep = nullptr;
    }
    const auto deadline = Clock::now() + args_.timeout;
    while (UCS_PTR_IS_PTR(closing)) {
      std::lock_guard<std::mutex> lock(mu_);
      ucp_worker_progress(worker_);
      if (ucp_request_check_status(closing) != UCS_INPROGRESS || Clock::now() >= deadline) {
        ucp_request_free(closing);
        break;
      }
    }
  }

  bool Lost(int pe) const { return losses_->lost(pe); }

  Status LostPeer(const char* op, int pe) const {
    return DeviceError(std::string("pe of another node is gone (its process exited or its node died): op=") + op +
                       " pe=" + std::to_string(pe) + " pe_node=" +
                       std::to_string(args_.nodes[static_cast<std::size_t>(pe)]) + " transport=ucx");
  }

  Status CheckRange(int pe, std::size_t heap_offset, std::size_t bytes, const char* op) const {
    if (!reaches(pe)) {
      return StateError(std::string("UCX has no endpoint to this pe: op=") + op + " pe=" + std::to_string(pe));
    }
    if (Lost(pe)) return LostPeer(op, pe);
    const std::uint64_t heap_bytes = peers_[static_cast<std::size_t>(pe)].heap_bytes;
    if (heap_offset > heap_bytes || bytes > heap_bytes - heap_offset) {
      return InvalidArgument("`heap_offset` + `bytes` must lie inside pe " + std::to_string(pe) + "'s heap of " +
                             std::to_string(heap_bytes) + " bytes, but got offset " + std::to_string(heap_offset) +
                             " + " + std::to_string(bytes) + " bytes (op=" + op + ")");
    }
    return Status::Ok();
  }

  Status Failure(const char* op, int pe, ucs_status_t status) const {
    if (Lost(pe)) return Status(StatusCode::kDeviceError, LostPeer(op, pe).message() + " status=" + UcsText(status));
    return DeviceError(std::string("remote ") + op + " failed: pe=" + std::to_string(pe) +
                       " transport=ucx status=" + UcsText(status));
  }

  // Posts a signal's atomic on `pe`'s endpoint (mu_ held): a swap for set (UCX has no atomic store; the old value
  // lands in a reply buffer and is dropped), an add for add. The caller completes or flushes it.
  ucs_status_ptr_t PostSignal(int pe, std::size_t heap_offset, SignalWidth width, std::int64_t value, SignalOp op) {
    const Peer& peer = peers_[static_cast<std::size_t>(pe)];
    // UCX may read the operand and write the reply after the call returns, until the request completes: per thread,
    // so that a request cancelled after a timeout never writes into a stack frame that is gone.
    thread_local std::int64_t operand64;
    thread_local std::int32_t operand32;
    thread_local std::int64_t reply64;
    thread_local std::int32_t reply32;
    operand64 = value;
    operand32 = static_cast<std::int32_t>(value);
    const bool wide = width == SignalWidth::k64;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_contig(static_cast<std::size_t>(width));
    if (op == SignalOp::kSet) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
      param.reply_buffer = wide ? static_cast<void*>(&reply64) : static_cast<void*>(&reply32);
    }
    return ucp_atomic_op_nbx(peer.ep, op == SignalOp::kSet ? UCP_ATOMIC_OP_SWAP : UCP_ATOMIC_OP_ADD,
                             wide ? static_cast<const void*>(&operand64) : static_cast<const void*>(&operand32), 1,
                             peer.heap_base + heap_offset, peer.rkey, &param);
  }

  ucs_status_ptr_t FlushLiveness(int pe) {
    ucp_request_param_t param{};
    std::lock_guard<std::mutex> lock(mu_);
    return ucp_ep_flush_nbx(peers_[static_cast<std::size_t>(pe)].live, &param);
  }

  Status Flush(int pe, const char* op) {
    ucp_request_param_t param{};
    ucs_status_ptr_t flush;
    {
      std::lock_guard<std::mutex> lock(mu_);
      flush = ucp_ep_flush_nbx(peers_[static_cast<std::size_t>(pe)].ep, &param);
    }
    return Complete(flush, op, pe);
  }

  // Waits for `request` (progressing the worker itself), at most the timeout; a request still running then is
  // cancelled and the failure names the PE.
  Status Complete(ucs_status_ptr_t request, const char* op, int pe) {
    if (request == nullptr) return Status::Ok();
    if (UCS_PTR_IS_ERR(request)) return Failure(op, pe, UCS_PTR_STATUS(request));
    const auto start = Clock::now();
    const auto deadline = start + args_.timeout;
    while (true) {
      bool progressed = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        progressed = ucp_worker_progress(worker_) != 0;
        const ucs_status_t status = ucp_request_check_status(request);
        if (status != UCS_INPROGRESS) {
          ucp_request_free(request);
          return status == UCS_OK ? Status::Ok() : Failure(op, pe, status);
        }
        if (Lost(pe)) {   // it will never complete: UCX releases it once it fails or the endpoint goes
          ucp_request_cancel(worker_, request);
          ucp_request_free(request);
          return LostPeer(op, pe);
        }
        if (Clock::now() >= deadline) {
          ucp_request_cancel(worker_, request);
          ucp_request_free(request);
          return Timeout(std::string("remote ") + op + " timed out: pe=" + std::to_string(pe) +
                         " transport=ucx timeout_sec=" +
                         Decimal(std::chrono::duration<double>(args_.timeout).count()));
        }
      }
      if (progressed) NotifyRemoteWrite();
      // The peer's progress thread must run for this to complete: leave it the core when ranks share few.
      if (Clock::now() - start > std::chrono::microseconds(20)) sched_yield();
    }
  }

  // One direction of one exchange of ExchangeMessages, until it completes.
  struct PendingMessage {
    MessageExchange* exchange;
    bool receive;
    ucs_status_ptr_t request;
    ucp_tag_recv_info_t info;   // a receive's length, filled by UCX
  };

  // Complete for many requests at once, within one timeout for all: each outcome lands in its exchange (the first
  // failure of an exchange is kept), a receive's length in its `received`.
  void CompleteAll(std::vector<PendingMessage>& pending) {
    const auto fail = [](PendingMessage& message, Status status) {
      if (message.exchange->status.ok()) message.exchange->status = std::move(status);
    };
    const auto op = [](const PendingMessage& message) {
      return message.receive ? "exchange_messages (receive)" : "exchange_messages (send)";
    };
    std::size_t open = 0;
    for (PendingMessage& message : pending) {
      if (message.request == nullptr) {   // complete at once
        if (message.receive) message.exchange->received = message.info.length;
      } else if (UCS_PTR_IS_ERR(message.request)) {
        fail(message, Failure(op(message), message.exchange->pe, UCS_PTR_STATUS(message.request)));
        message.request = nullptr;
      } else {
        ++open;
      }
    }
    const auto start = Clock::now();
    const auto deadline = start + args_.timeout;
    while (open > 0) {
      bool progressed = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        progressed = ucp_worker_progress(worker_) != 0;
        const bool late = Clock::now() >= deadline;
        for (PendingMessage& message : pending) {
          if (message.request == nullptr) continue;
          const int pe = message.exchange->pe;
          const ucs_status_t status = message.receive ? ucp_tag_recv_request_test(message.request, &message.info)
                                                      : ucp_request_check_status(message.request);
          if (status == UCS_INPROGRESS && !late && !Lost(pe)) continue;
          if (status == UCS_INPROGRESS) {   // it will never complete: UCX releases it once cancelled
            ucp_request_cancel(worker_, message.request);
            fail(message, Lost(pe) ? LostPeer(op(message), pe)
                                   : Timeout(std::string("remote ") + op(message) + " timed out: pe=" +
                                             std::to_string(pe) + " transport=ucx timeout_sec=" +
                                             Decimal(std::chrono::duration<double>(args_.timeout).count())));
          } else if (status != UCS_OK) {
            fail(message, Failure(op(message), pe, status));
          } else if (message.receive) {
            message.exchange->received = message.info.length;
          }
          ucp_request_free(message.request);
          message.request = nullptr;
          --open;
        }
      }
      if (progressed) NotifyRemoteWrite();
      // The peers' progress threads must run for this to complete: leave them the core when ranks share few.
      if (Clock::now() - start > std::chrono::microseconds(20)) sched_yield();
    }
  }

  void ProgressLoop() {
    while (!stopping_.load()) {
      bool progressed = false;
      ucs_status_t armed = UCS_OK;
      {
        std::lock_guard<std::mutex> lock(mu_);
        while (ucp_worker_progress(worker_) != 0) progressed = true;
        if (!progressed) armed = ucp_worker_arm(worker_);
      }
      if (progressed) {
        NotifyRemoteWrite();
        continue;
      }
      if (armed == UCS_ERR_BUSY) continue;   // events arrived between the progress and the arm
      pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      (void)poll(fds, 2, 100);   // bounded, so that a missed wake-up costs a slice, never a hang
    }
  }

  // A peer's atomic on this rank's heap may have been carried out by the progress just made.
  void NotifyRemoteWrite() const {
    if (args_.on_remote_write) args_.on_remote_write();
  }

  // The low bits of a message's UCX tag: its sender's PE (ExchangeMessages).
  static constexpr int kSenderBits = 64 - kMessageTagBits;

  struct LivenessArg {
    UcxTransport* transport;
    int pe;
  };

  RemoteTransportArgs args_;
  std::vector<Peer> peers_;
  std::vector<LivenessArg> liveness_args_;      // the error callbacks' arguments: fixed addresses, one per PE
  std::shared_ptr<PeerLosses> losses_;          // a PE is lost once its liveness endpoint failed
  std::vector<char> blobs_;   // the exchanged addresses and keys, until every endpoint is made
  std::size_t address_slot_ = 0;
  std::size_t slot_ = 0;
  bool peers_published_ = true;   // every rank published its address and key (Exchange)
  std::mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  int worker_fd_ = -1;
  int stop_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread progress_;
};

}  // namespace

Result<std::unique_ptr<RemoteTransport>> OpenRemoteTransport(const RemoteTransportArgs& args, std::string* absence) {
  auto transport = std::make_unique<UcxTransport>(args);
  const std::string failed = transport->Open();
  if (!failed.empty()) {
    *absence = "UCX cannot serve on rank " + std::to_string(args.rank) + ": " + failed;
    return std::unique_ptr<RemoteTransport>();
  }
  return std::unique_ptr<RemoteTransport>(std::move(transport));
}

}  // namespace hp::shmem::host
