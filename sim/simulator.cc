#include "sim/simulator.h"

#include <cstdio>

#include <fmt/format.h>

#include "shm/layout.h"

namespace warmpool::sim {

using supervisor::Action;
using supervisor::Event;
namespace event = supervisor::event;
namespace action = supervisor::action;

namespace {

constexpr size_t kTraceLines = 400;
constexpr uint64_t kUnixBaseNs = 1'760'000'000'000'000'000ull;

}  // namespace

Outcome Run(const Options& options) {
  Simulator simulator(options);
  return simulator.Run();
}

Simulator::Simulator(const Options& options) : options_(options), rng_(options.seed) {}

Simulator::~Simulator() = default;

supervisor::Time Simulator::Now() const { return supervisor::Time{now_, kUnixBaseNs + now_ * 1000000}; }

void Simulator::At(uint64_t time, std::function<void()> fn, bool outlives) {
  queue_.push(Scheduled{std::max(time, now_), seq_++, outlives ? 0 : life_, std::move(fn)});
}

void Simulator::Trace(const std::string& line) {
  std::string stamped = fmt::format("{:>8} {}", now_, line);
  if (options_.trace) std::printf("%s\n", stamped.c_str());
  trace_.push_back(std::move(stamped));
  if (trace_.size() > kTraceLines) trace_.pop_front();
}

void Simulator::Fail(const std::string& what) {
  if (failed_) return;
  failed_ = true;
  outcome_.ok = false;
  outcome_.failure = fmt::format("at {} ms, after {} events: {}", now_, outcome_.events, what);
  Trace("INVARIANT BROKEN: " + what);
}

void Simulator::StartCore(std::vector<supervisor::KeptWeights> kept) {
  std::vector<uint64_t> budgets;
  for (const supervisor::DeviceConfig& d : config_.devices) budgets.push_back(d.budget_bytes);
  shm::Limits limits{config_.max_models, static_cast<uint32_t>(workers_.size()), config_.max_inflight};
  segment_bytes_.assign(shm::SegmentSize(limits), std::byte{0});
  auto view = shm::SegmentView::Format(segment_bytes_, limits, budgets, 1);
  segment_ = *view;
  core_ = std::make_unique<supervisor::Core>(config_, segment_);
  NoteRegisteredVersions();
  std::vector<Action> actions = core_->Start(Registry(), {}, Now(), std::move(kept));
  for (Action& a : actions) Execute(a);
  CheckAfterEvent();
  CheckAdopted();
  RunPendingEvents();
  After(supervisor::kTickMs, [this] { Tick(); });
}

void Simulator::NoteRegisteredVersions() {
  registered_version_.resize(files_.size(), 0);
  for (const SimFile& f : files_) {
    if (configured_[f.id] && !f.echo) registered_version_[f.id] = f.version;
  }
}

std::vector<supervisor::ModelEntry> Simulator::Registry() const {
  std::vector<supervisor::ModelEntry> entries;
  for (const SimFile& f : files_) {
    if (configured_[f.id]) entries.push_back(EntryOf(f));
  }
  return entries;
}

void Simulator::Deliver(Event event, const std::string& what) {
  if (failed_ || workers_stopped_) return;
  if (paused_) return Fail("an event reached the core while the supervisor was paused: " + what);
  outcome_.events++;
  Trace("-> " + what);
  std::vector<Action> actions = core_->Handle(std::move(event), Now());
  for (Action& a : actions) Execute(a);
  CheckAfterEvent();
  RunPendingEvents();
}

void Simulator::RunPendingEvents() {
  while (!pending_events_.empty() && !failed_) {
    std::vector<std::function<void()>> events;
    events.swap(pending_events_);
    for (auto& e : events) e();
  }
}

void Simulator::Execute(Action& a) {
  std::visit(
      [&](auto&& act) {
        using A = std::decay_t<decltype(act)>;
        if constexpr (std::is_same_v<A, action::SendToWorker>) {
          if (Status allocation = action::CheckAllocation(act); !allocation.ok()) return Fail(allocation.message());
          if (act.offer >= 0 && !OfferKept(act)) return;
          SendToWorker(act.slot, std::move(act.frame), act.handles);
        } else if constexpr (std::is_same_v<A, action::SpawnWorker>) {
          Trace(fmt::format("<- spawn worker {} generation {}", act.slot, act.generation));
          if (stop_workers_sent_) return Fail("a worker was started after the workers were stopped");
          Spawn(act.slot, act.generation);
        } else if constexpr (std::is_same_v<A, action::Reply>) {
          Trace(fmt::format("<- reply session {} request {}: {}", act.session,
                            act.envelope.request_id(),
                            act.envelope.has_error() ? act.envelope.error().message()
                                                     : std::string("ok")));
          CheckDeadlineReply(act.session, act.envelope);
          if (gone_sessions_.count(act.session) != 0) {
            Fail(fmt::format("replied to request {} of session {} after the client was gone",
                             act.envelope.request_id(), act.session));
            return;
          }
          for (Client& c : clients_) {
            if (c.session != act.session) continue;
            auto it = c.outstanding.find(act.envelope.request_id());
            if (it != c.outstanding.end() && act.envelope.has_generate_chunk()) {
              CheckChunkSent(it->second, act.envelope);
            } else if (it != c.outstanding.end()) {
              if (it->second.replied) {
                Fail(fmt::format("request {} of session {} answered twice",
                                 act.envelope.request_id(), act.session));
              }
              it->second.replied = true;
            }
            uint64_t at = std::max(now_ + rng_.Range(0, 2), c.last_delivery_ms);
            c.last_delivery_ms = at;
            At(at, [this, session = act.session, reply = std::move(act.envelope)] {
              ClientReceives(session, reply);
            });
          }
        } else if constexpr (std::is_same_v<A, action::KillWorker>) {
          Trace(fmt::format("<- kill worker {}: {}", act.slot, act.reason));
          CheckKill(act.slot, act.reason);
          Kill(act.slot, act.reason);
        } else if constexpr (std::is_same_v<A, action::CloseHandle>) {
          Trace(fmt::format("<- close handle {}{}", act.handle, act.keep ? " (kept for reuse)" : ""));
          ForgetStored(act.handle);
          if (supervisor_handles_.erase(act.handle) == 0) {
            Fail(fmt::format("closed handle {}, which the supervisor does not hold", act.handle));
          }
          if (act.keep) kept_handles_.insert(act.handle);
        } else if constexpr (std::is_same_v<A, action::DropKept>) {
          DropKept(act.handle);
        } else if constexpr (std::is_same_v<A, action::InspectModel>) {
          Trace(fmt::format("<- inspect model {} ({})", act.model, act.path));
          After(rng_.Range(0, 5), Reading([this, inspect = act] {
            event::ModelInspected e;
            e.model = inspect.model;
            e.path = inspect.path;
            e.resolved = inspect.path;
            for (const SimFile& f : files_) {
              if (f.path == inspect.path && f.name == inspect.name) e.entry = EntryOf(f);
            }
            Deliver(std::move(e), fmt::format("model {} inspected", inspect.model));
          }));
        } else if constexpr (std::is_same_v<A, action::Log>) {
          Trace("   log: " + act.text);
        } else if constexpr (std::is_same_v<A, action::Notify>) {
          Trace("   notify: " + act.status);
        } else if constexpr (std::is_same_v<A, action::StopAccepting>) {
          Trace("<- stop accepting");
        } else if constexpr (std::is_same_v<A, action::CloseSessions>) {
          Trace("<- close sessions");
          for (Client& c : clients_) {
            if (!c.connected) continue;
            for (const auto& [id, p] : c.outstanding) {
              if (p.accepted && !p.replied) {
                Fail(fmt::format("session {} closed with request {} ({}) unanswered", c.session,
                                 id, p.model));
              }
            }
            c.connected = false;
            gone_sessions_.insert(c.session);
          }
        } else if constexpr (std::is_same_v<A, action::StoreKept>) {
          Trace(fmt::format("<- store {} kept", act.kept.size()));
          stored_ = std::move(act.kept);
          ticks_since_stored_ = 0;
        } else if constexpr (std::is_same_v<A, action::StopWorkers>) {
          Trace("<- stop workers");
          stop_workers_sent_ = true;
          for (Worker& w : workers_) {
            if (w.state == Worker::State::kDown) continue;
            uint32_t slot = w.slot, generation = w.generation;
            After(rng_.Range(0, act.kill_after_ms), [this, slot, generation] {
              Die(slot, generation, "exited with status 0", false);
            });
          }
          After(act.kill_after_ms + 1, Reading([this] {
            for (Worker& w : workers_) {
              if (w.state != Worker::State::kDown) return Fail("a worker outlived the stop");
            }
            Deliver(event::WorkersStopped{}, "workers stopped");
            workers_stopped_ = true;
          }));
        }
      },
      a);
}

void Simulator::EnvironmentAct() {
  if (stopping_ || failed_) return;
  if (Hold([this] { EnvironmentAct(); })) return;  // signals and the shell's findings are read later
  uint64_t roll = rng_.Below(1000);
  if (calm_ && roll >= 300) roll = 999;  // files change, nothing else happens
  if (roll < 300) {
    // A model file replaced on disk, with no reload.
    SimFile& f = files_[rng_.Below(files_.size())];
    if (!f.echo) {
      f.version++;
      Trace(fmt::format("== file {} now at version {}", f.path, f.version));
    }
  } else if (roll < 500) {
    // The operator edits the configuration and reloads: a model leaves or comes back.
    if (rng_.Chance(500)) {
      uint32_t id = static_cast<uint32_t>(rng_.Below(6));
      configured_[id] = !configured_[id];
      Trace(fmt::format("== {} {} the configuration", files_[id].name,
                        configured_[id] ? "back in" : "removed from"));
    }
    event::Reload e;
    supervisor::Config c = config_;
    c.models.clear();
    for (const supervisor::ModelConfig& m : config_.models) {
      for (const SimFile& f : files_) {
        if (f.name == m.name && configured_[f.id]) c.models.push_back(m);
      }
    }
    e.config = c;
    e.entries = Registry();
    NoteRegisteredVersions();
    Deliver(std::move(e), "SIGHUP");
  } else if (roll < 560) {
    SimFile& f = files_[rng_.Below(5)];
    f.broken = !f.broken;
    Trace(fmt::format("== file {} {}", f.path, f.broken ? "broken" : "fixed"));
  } else if (roll < 700) {
    uint32_t slot = static_cast<uint32_t>(rng_.Below(workers_.size()));
    if (workers_[slot].state == Worker::State::kUp) {
      Trace(fmt::format("== worker {} killed from outside", slot));
      Kill(slot, "");
    }
  } else if (roll < 703 && config_.devices.size() > 1) {
    // A worker of a device other than the first exits with status 2 (fatal configuration): it is
    // never started again. All of a device's may go: its models must then be served elsewhere.
    uint32_t slot = static_cast<uint32_t>(config_.workers_per_device +
                                          rng_.Below(workers_.size() - config_.workers_per_device));
    if (workers_[slot].state == Worker::State::kUp) {
      Trace(fmt::format("== worker {} exits with status 2", slot));
      Kill(slot, "fatal", /*fatal=*/true);
    }
  } else if (roll < 715) {
    // cuda: a device's memory owner dies, and every region on that device with it (host copies
    // and other devices live).
    // Its owner comes back after a while (the device is usable again from then), unless it cannot
    // run at all: then, in a world of several devices, that device is gone for good.
    const uint32_t device = static_cast<uint32_t>(rng_.Below(config_.devices.size()));
    if (devices_gone_[device]) return After(rng_.Range(100, 800), [this] { EnvironmentAct(); });
    size_t lost = 0;
    for (int h : supervisor_handles_) {
      if (!regions_[h].host && regions_[h].device == device) lost += lost_handles_.insert(h).second;
    }
    const bool for_good = device != 0 && rng_.Chance(100);
    devices_gone_[device] = for_good;
    const uint32_t epoch = ++device_epochs_[device];
    devices_down_[device] = true;
    Trace(fmt::format("== the memory owner of device {} killed ({} device regions lost){}", device, lost,
                      for_good ? ", for good" : ""));
    DisbelieveDevice(device);
    Deliver(event::DeviceLost{device, "killed by signal 9", for_good}, fmt::format("device {} lost", device));
    if (!for_good) {
      After(rng_.Range(20, 600), Reading([this, device, epoch] {
        if (device_epochs_[device] != epoch) return;  // it died again meanwhile
        devices_down_[device] = false;
        Deliver(event::DeviceRestored{device}, fmt::format("device {} restored", device));
      }));
    }
  } else if (roll < 735) {
    RestartSupervisor();
  } else if (roll < 760) {
    Pause(rng_.Range(100, 3000));
  }
  After(rng_.Range(100, 800), [this] { EnvironmentAct(); }, /*outlives=*/true);
}

Outcome Simulator::Run() {
  MakeWorld();
  StartCore({});
  for (uint32_t i = 0; i < clients_.size(); i++) {
    uint32_t index = i;
    After(rng_.Range(0, 50), [this, index] { ClientAct(index); }, /*outlives=*/true);
  }
  After(rng_.Range(100, 500), [this] { EnvironmentAct(); }, /*outlives=*/true);

  while (!queue_.empty() && !failed_) {
    if (!stopping_ && !paused_ && outcome_.events >= options_.events) {
      stopping_ = true;
      Deliver(event::Stop{}, "SIGTERM");
    }
    Scheduled next = queue_.top();
    queue_.pop();
    if (next.life != 0 && next.life != life_) continue;  // its supervisor died before it came
    now_ = next.time;
    next.fn();
    if (stopping_ && workers_stopped_) break;
    if (now_ > 24ull * 3600 * 1000) {
      Fail("a day of simulated time passed without the stop completing");
    }
  }
  if (!failed_) {
    if (!workers_stopped_) Fail("the simulation ran out of events before the daemon stopped");
    else CheckFinal();
  }
  outcome_.sim_ms = now_;
  if (!outcome_.ok) outcome_.trace.assign(trace_.begin(), trace_.end());
  return outcome_;
}

}  // namespace warmpool::sim
