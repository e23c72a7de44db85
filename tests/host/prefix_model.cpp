// Model-based test of shared prefixes on the host hierarchy (docs/prefixes.md): >= 10^6 random
// operations over four configurations (host store and prefix budget tight or loose): plain
// admissions, admissions on retained prefixes (some unknown: unknown_prefix), appends (some past
// the host store or the capacity), reservations, resolves checked byte for byte, optional pages
// mapped and unmapped (shared pool pages), retains of whole and partial histories (some duplicate,
// past the frontier or past the budget), releases (some twice) and completions.
//
// The model is the test's own: it names every host page it expects allocated by an abstract token
// (a new token for every page a request allocates or a boundary copy makes; a shared page keeps its
// token), counts holders per token, keeps the prefixes' LRU order and budget, the free optional
// pool (lowest page first) and the content tag of every row. After every operation it checks the
// whole state against the hierarchy: tokens and host pages correspond one to one, holder and
// prefix-holder counts, free host pages, frontiers and reserved rows, optional maps and their
// sharing counts, free optional pages, the retained prefixes in LRU order, their rows and the
// pages they hold. A failing operation must throw the typed error the model predicts and leave
// every one of these unchanged.
#include "../support/catch.hpp"

#include <dhisparse/host/hierarchy.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../support/reference_model.hpp"
#include "../support/row_content.hpp"

namespace {

using namespace dhisparse;
using dhisparse_testing::request_tag;
using dhisparse_testing::test_rng;
using H = host_hierarchy<layouts::tiny, lru_hot_cache<16>>;
constexpr std::size_t kSources = 2;
static_assert(H::sources == kSources);
// The model's own geometry (layouts::tiny): 8-row pages; source 0 has 2 payload layers of 64
// bytes, source 1 one of 32. Checked once, never read from the library below.
constexpr std::size_t kPageRows = 8;
constexpr std::array<std::size_t, kSources> kLayers{2, 1};
constexpr std::array<std::size_t, kSources> kRowBytes{64, 32};
constexpr std::size_t kTopK = 16;
static_assert(H::page_rows == kPageRows && H::top_k == kTopK);
static_assert(layouts::tiny::sources[0].payload_layers == 2 && layouts::tiny::sources[1].payload_layers == 1);
static_assert(layouts::tiny::sources[0].row_bytes == 64 && layouts::tiny::sources[1].row_bytes == 32);

#ifndef DHISPARSE_PREFIX_OPS
#  if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kOpsPerConfig = 25'000;
#  else
constexpr std::size_t kOpsPerConfig = 250'000;  // x 4 configurations = 10^6 operations
#  endif
#else
constexpr std::size_t kOpsPerConfig = DHISPARSE_PREFIX_OPS;
#endif

using token = std::uint64_t;

std::size_t pages_for(std::int64_t rows) { return (static_cast<std::size_t>(rows) + kPageRows - 1) / kPageRows; }

struct model_source {
  std::vector<std::uint64_t> tags;  // content tag of each stored row
  std::vector<token> pages;         // allocated history pages (stored or reserved), by token
  std::vector<std::int32_t> opt;    // history page -> optional pool page, -1
};
struct model_request {
  std::uint64_t tag = 0;  // tag of the rows this request writes itself
  std::array<model_source, kSources> src;
};
struct model_prefix {
  std::array<std::int64_t, kSources> rows{};
  std::array<std::vector<token>, kSources> pages;
  std::array<std::vector<std::uint64_t>, kSources> tags;
};

struct run_config {
  std::size_t max_requests = 6, max_rows = 64, host_pages = 40, prefix_pages = 12, optional_pages = 10;
  std::uint64_t seed = 1;
};

class prefix_model_run {
 public:
  explicit prefix_model_run(const run_config& c)
      : c_(c),
        h_(hierarchy_config{.max_requests = c.max_requests, .max_rows = c.max_rows, .host_pages = c.host_pages,
                            .optional_pages = c.optional_pages, .prefix_pages = c.prefix_pages}),
        rng_(c.seed) {
    for (std::int32_t g = 0; g < static_cast<std::int32_t>(c.optional_pages); ++g)
      for (auto& f : free_opt_) f.insert(g);
  }

  std::size_t checks = 0, ops = 0, errors_seen = 0, waits = 0, resolved_rows = 0, evictions = 0, shared_admits = 0;

  void run(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      step_one();
      ++ops;
      check_state();
    }
    // Drain: release every prefix and complete every request; every page must be free.
    for (auto id : lru_) h_.release_prefix(id);
    pre_.clear();
    lru_.clear();
    std::vector<request_id> ids;
    for (auto& [id, r] : req_) ids.push_back(id);
    for (auto id : ids) h_.complete(id);
    for (std::size_t s = 0; s < kSources; ++s) {
      expect(h_.free_host_pages(s) == c_.host_pages, "drain: host pages left allocated");
      expect(h_.free_optional_pages(s) == c_.optional_pages, "drain: optional pages left mapped");
      expect(h_.prefix_pages_held(s) == 0, "drain: prefix pages held");
    }
  }

 private:
  // --------------------------------------------------------------------------- model helpers
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok) {
      INFO("seed " << c_.seed << " op " << ops << ": " << what);
      REQUIRE(ok);
    }
  }
  std::size_t used_tokens(std::size_t s) const {
    std::size_t n = 0;
    for (const auto& [t, r] : refs_[s]) n += r > 0;
    return n;
  }
  std::size_t free_pages(std::size_t s) const { return c_.host_pages - used_tokens(s); }
  token new_token(std::size_t s) {
    const token t = next_token_++;
    refs_[s][t] = 1;
    return t;
  }
  void drop(std::size_t s, token t) {
    if (--refs_[s][t] == 0) refs_[s].erase(t);
  }
  void unmap_model(std::size_t s, model_source& ms, std::size_t page) {
    const std::int32_t g = ms.opt[page];
    ms.opt[page] = -1;
    if (--opt_refs_[s][g] == 0) {
      opt_refs_[s].erase(g);
      opt_of_token_[s].erase(ms.pages[page]);
      free_opt_[s].insert(g);
    }
  }
  request_id pick_request() {
    auto it = req_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng_.below(req_.size())));
    return it->first;
  }
  prefix_id pick_prefix() { return lru_[rng_.below(lru_.size())]; }
  std::size_t prefix_held(std::size_t s, const std::map<prefix_id, model_prefix>& pre) const {
    std::set<token> held;
    for (const auto& [id, p] : pre) held.insert(p.pages[s].begin(), p.pages[s].end());
    return held.size();
  }

  template <class Error, class F>
  void expect_error(F&& f, const std::string& what) {
    bool threw = false;
    try {
      f();
    } catch (const Error&) {
      threw = true;
    } catch (const std::exception& e) {
      expect(false, what + ": threw the wrong error: " + e.what());
    }
    expect(threw, what + ": did not throw");
    ++errors_seen;
  }

  // --------------------------------------------------------------------------- operations
  void step_one() {
    const std::size_t roll = rng_.below(100);
    if (roll < 8) return op_admit();
    if (roll < 18) return op_admit_on_prefix();
    if (roll < 40) return op_append();
    if (roll < 44) return op_reserve();
    if (roll < 64) return op_resolve();
    if (roll < 70) return op_map();
    if (roll < 73) return op_unmap();
    if (roll < 83) return op_retain();
    if (roll < 88) return op_release();
    if (roll < 96) return op_complete();
    return op_bad_request();
  }

  void op_admit() {
    const request_id id = next_id_++;
    const admission a = h_.admit(id);
    if (req_.size() >= c_.max_requests) {
      expect(!a.admitted, "plain admission with every slot taken");
      ++waits;
      return;
    }
    expect(a.admitted, "plain admission with a free slot");
    add_request(id);
  }
  model_request& add_request(request_id id) {
    auto& r = req_[id];
    r.tag = request_tag(id, 7);
    for (auto& ms : r.src) ms.opt.assign(pages_for(static_cast<std::int64_t>(c_.max_rows)), -1);
    return r;
  }

  void op_admit_on_prefix() {
    if (lru_.empty() || rng_.chance(1, 10)) {
      const prefix_id bogus = next_prefix_ + 1000 + rng_.below(5);  // never retained
      const request_id id = next_id_++;
      expect_error<unknown_prefix>([&] { (void)h_.admit(id, bogus); }, "admission on an unknown prefix");
      expect(!h_.contains(id), "failed admission left the request admitted");
      return;
    }
    if (!req_.empty() && rng_.chance(1, 20)) {  // an id already admitted
      const request_id id = pick_request();
      expect_error<duplicate_admission>([&] { (void)h_.admit(id, pick_prefix()); }, "admission of an admitted id");
      return;
    }
    const prefix_id p = pick_prefix();
    const model_prefix& mp = pre_.at(p);
    bool fits = req_.size() < c_.max_requests;
    for (std::size_t s = 0; s < kSources; ++s)
      if (mp.rows[s] % static_cast<std::int64_t>(kPageRows) != 0 && free_pages(s) == 0) fits = false;
    const request_id id = next_id_++;
    const admission a = h_.admit(id, p);
    expect(a.admitted == fits, "admission on a prefix: admitted " + std::to_string(a.admitted) + ", model says " +
                                   std::to_string(fits));
    if (!fits) {
      ++waits;
      return;
    }
    ++shared_admits;
    auto& r = add_request(id);
    for (std::size_t s = 0; s < kSources; ++s) {
      auto& ms = r.src[s];
      ms.tags = mp.tags[s];
      const std::size_t full = static_cast<std::size_t>(mp.rows[s]) / kPageRows;
      for (std::size_t g = 0; g < full; ++g) {
        ms.pages.push_back(mp.pages[s][g]);
        ++refs_[s][mp.pages[s][g]];
      }
      if (full < mp.pages[s].size()) ms.pages.push_back(new_token(s));  // the boundary copy
    }
    touch(p);
  }
  void touch(prefix_id p) {
    lru_.erase(std::find(lru_.begin(), lru_.end(), p));
    lru_.push_back(p);
  }

  void op_append() {
    if (req_.empty()) return;
    const request_id id = pick_request();
    auto& r = req_.at(id);
    const std::size_t s = rng_.below(kSources);
    auto& ms = r.src[s];
    const auto f = static_cast<std::int64_t>(ms.tags.size());
    const std::size_t count = rng_.chance(1, 30) ? 20 : 1 + rng_.below(rng_.chance(1, 4) ? 12 : 3);
    const auto buf = dhisparse_testing::make_append_buffer(r.tag, s, kLayers[s], kRowBytes[s], f, count);
    if (f + static_cast<std::int64_t>(count) > static_cast<std::int64_t>(c_.max_rows)) {
      expect_error<capacity_exceeded>([&] { h_.append(id, s, buf, count); }, "append past max_rows");
      return;
    }
    const std::size_t want = pages_for(f + static_cast<std::int64_t>(count));
    const std::size_t need = want > ms.pages.size() ? want - ms.pages.size() : 0;
    if (need > free_pages(s)) {
      expect_error<host_pool_exhausted>([&] { h_.append(id, s, buf, count); }, "append past the host store");
      return;
    }
    h_.append(id, s, buf, count);
    while (ms.pages.size() < want) ms.pages.push_back(new_token(s));
    for (std::size_t i = 0; i < count; ++i) ms.tags.push_back(r.tag);
  }

  void op_reserve() {
    if (req_.empty()) return;
    const request_id id = pick_request();
    const std::size_t s = rng_.below(kSources);
    auto& ms = req_.at(id).src[s];
    const std::size_t ahead = rng_.below(20);
    const auto end = std::min<std::int64_t>(static_cast<std::int64_t>(c_.max_rows),
                                            static_cast<std::int64_t>(ms.tags.size() + ahead));
    const std::size_t want = pages_for(end);
    const std::size_t need = want > ms.pages.size() ? want - ms.pages.size() : 0;
    if (need > free_pages(s)) {
      expect_error<host_pool_exhausted>([&] { h_.reserve_rows(id, s, ahead); }, "reservation past the host store");
      return;
    }
    h_.reserve_rows(id, s, ahead);
    while (ms.pages.size() < want) ms.pages.push_back(new_token(s));
  }

  void op_resolve() {
    if (req_.empty()) return;
    const request_id id = pick_request();
    const std::size_t s = rng_.below(kSources);
    const auto& ms = req_.at(id).src[s];
    const auto f = static_cast<std::int64_t>(ms.tags.size());
    std::vector<row_index> sel(rng_.below(kTopK + 1), no_row);
    for (auto& e : sel)
      if (f > 0 && !rng_.chance(1, 8)) e = static_cast<row_index>(rng_.below(static_cast<std::size_t>(f)));
    std::vector<location> loc(sel.size(), 7);
    (void)h_.resolve(id, s, sel, loc);
    for (std::size_t i = 0; i < sel.size(); ++i) {
      if (sel[i] == no_row) {
        expect(loc[i] == no_location, "padding resolved to a location");
        continue;
      }
      ++resolved_rows;
      for (std::size_t l = 0; l < kLayers[s]; ++l) {
        const auto bytes = h_.payload(s, l, loc[i]);
        const std::uint64_t tag = ms.tags[static_cast<std::size_t>(sel[i])];
        if (!dhisparse_testing::row_matches(bytes, tag, s, l, sel[i]))
          expect(false, "request " + std::to_string(id) + " resolved " +
                            dhisparse_testing::describe_row_mismatch(bytes, tag, s, l, sel[i]));
        else
          ++checks;
      }
    }
  }

  void op_map() {
    if (req_.empty()) return;
    const request_id id = pick_request();
    const std::size_t s = rng_.below(kSources);
    auto& ms = req_.at(id).src[s];
    const std::size_t complete = ms.tags.size() / kPageRows;
    if (complete == 0) {
      expect_error<position_beyond_frontier>([&] { (void)h_.map_optional_page(id, s, 0); }, "mapping an incomplete page");
      return;
    }
    const std::size_t page = rng_.below(complete);
    const bool ok = h_.map_optional_page(id, s, page);
    if (ms.opt[page] >= 0) {
      expect(ok, "mapping a mapped page");
      return;
    }
    const token t = ms.pages[page];
    if (auto it = opt_of_token_[s].find(t); it != opt_of_token_[s].end()) {  // shared: no pool page taken
      expect(ok, "mapping a page another request maps");
      ms.opt[page] = it->second;
      ++opt_refs_[s][it->second];
      return;
    }
    if (free_opt_[s].empty()) {
      expect(!ok, "mapping with the pool empty");
      return;
    }
    expect(ok, "mapping with a free pool page");
    const std::int32_t g = *free_opt_[s].begin();  // lowest free page first
    free_opt_[s].erase(free_opt_[s].begin());
    ms.opt[page] = g;
    opt_of_token_[s][t] = g;
    opt_refs_[s][g] = 1;
  }

  void op_unmap() {
    if (req_.empty()) return;
    const request_id id = pick_request();
    const std::size_t s = rng_.below(kSources);
    auto& ms = req_.at(id).src[s];
    const std::size_t page = rng_.below(ms.opt.size());
    h_.unmap_optional_page(id, s, page);
    if (ms.opt[page] >= 0) unmap_model(s, ms, page);
  }

  void op_retain() {
    if (req_.empty()) return;
    const request_id id = pick_request();
    const auto& r = req_.at(id);
    if (!lru_.empty() && rng_.chance(1, 15)) {
      const prefix_id p = pick_prefix();
      expect_error<duplicate_prefix>([&] { (void)h_.retain_prefix(p, id); }, "retaining a retained prefix id");
      return;
    }
    if (lru_.size() >= 24) {  // prefixes sharing pages are not bounded by the budget: bound the check's cost
      h_.release_prefix(lru_.front());
      drop_prefix(lru_.front());
    }
    const prefix_id p = next_prefix_++;
    std::array<std::int64_t, kSources> rows{};
    const bool whole = rng_.chance(1, 2);
    bool beyond = false;
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto f = static_cast<std::int64_t>(r.src[s].tags.size());
      rows[s] = whole ? f : static_cast<std::int64_t>(rng_.below(static_cast<std::size_t>(f) + 1));
      if (!whole && rng_.chance(1, 30)) {
        rows[s] = f + 1;
        beyond = true;
      }
    }
    if (beyond) {
      expect_error<position_beyond_frontier>([&] { (void)h_.retain_prefix(p, id, rows); }, "retaining past the frontier");
      return;
    }
    model_prefix mp;
    mp.rows = rows;
    for (std::size_t s = 0; s < kSources; ++s) {
      const auto& ms = r.src[s];
      mp.pages[s].assign(ms.pages.begin(), ms.pages.begin() + static_cast<std::ptrdiff_t>(pages_for(rows[s])));
      mp.tags[s].assign(ms.tags.begin(), ms.tags.begin() + rows[s]);
    }
    // Predicted evictions: least recently used first while the distinct pages held exceed the budget.
    std::map<prefix_id, model_prefix> after = pre_;
    after.emplace(p, mp);
    std::vector<prefix_id> victims;
    auto over = [&] {
      for (std::size_t s = 0; s < kSources; ++s)
        if (prefix_held(s, after) > c_.prefix_pages) return true;
      return false;
    };
    for (std::size_t i = 0; i < lru_.size() && over(); ++i) {
      victims.push_back(lru_[i]);
      after.erase(lru_[i]);
    }
    if (over()) {
      expect_error<prefix_budget_exceeded>(
          [&] { (void)(whole ? h_.retain_prefix(p, id) : h_.retain_prefix(p, id, rows)); }, "retaining past the budget");
      return;
    }
    const auto evicted = whole ? h_.retain_prefix(p, id) : h_.retain_prefix(p, id, rows);
    expect(evicted == victims, "evicted prefixes differ from the model's LRU choice");
    evictions += victims.size();
    for (prefix_id v : victims) drop_prefix(v);
    for (std::size_t s = 0; s < kSources; ++s)
      for (token t : mp.pages[s]) ++refs_[s][t];
    pre_.emplace(p, std::move(mp));
    lru_.push_back(p);
  }
  void drop_prefix(prefix_id p) {
    const auto& mp = pre_.at(p);
    for (std::size_t s = 0; s < kSources; ++s)
      for (token t : mp.pages[s]) drop(s, t);
    pre_.erase(p);
    lru_.erase(std::find(lru_.begin(), lru_.end(), p));
  }

  void op_release() {
    if (lru_.empty() || rng_.chance(1, 6)) {
      const prefix_id bogus = released_.empty() ? next_prefix_ + 77 : released_[rng_.below(released_.size())];
      expect_error<unknown_prefix>([&] { h_.release_prefix(bogus); }, "releasing a prefix not retained");
      return;
    }
    const prefix_id p = pick_prefix();
    h_.release_prefix(p);
    drop_prefix(p);
    released_.push_back(p);
    if (released_.size() > 64) released_.erase(released_.begin());
  }

  void op_complete() {
    if (req_.empty()) return;
    const request_id id = pick_request();
    h_.complete(id);
    auto& r = req_.at(id);
    for (std::size_t s = 0; s < kSources; ++s) {
      auto& ms = r.src[s];
      for (std::size_t page = 0; page < ms.opt.size(); ++page)
        if (ms.opt[page] >= 0) unmap_model(s, ms, page);
      for (token t : ms.pages) drop(s, t);
    }
    req_.erase(id);
  }

  void op_bad_request() {
    const request_id id = next_id_ + 500;  // never admitted
    switch (rng_.below(3)) {
      case 0: expect_error<unknown_request>([&] { h_.complete(id); }, "completing an unknown request"); break;
      case 1:
        expect_error<unknown_request>([&] { (void)h_.retain_prefix(next_prefix_, id); }, "retaining from an unknown request");
        break;
      default:
        if (req_.empty()) return;
        expect_error<size_mismatch>(
            [&] {
              const std::int64_t one = 0;
              (void)h_.retain_prefix(next_prefix_, pick_request(), std::span<const std::int64_t>(&one, 1));
            },
            "retain with rows for one source");
    }
  }

  // --------------------------------------------------------------------------- the whole state
  // Evaluates the message only on failure: the whole state is checked after every operation.
#define DH_EXPECT(cond, msg)       \
  do {                             \
    ++checks;                      \
    if (!(cond)) expect(false, msg); \
  } while (0)
  void check_state() {
    DH_EXPECT(h_.admitted_count() == req_.size(), "admitted count");
    for (std::size_t s = 0; s < kSources; ++s) {
      std::map<token, page_id> page_of;  // the model's tokens and the library's pages, one to one
      std::map<page_id, token> token_of;
      auto match = [&](token t, page_id g, auto&& who) {
        if (g == no_page) {
          DH_EXPECT(false, who() + ": no host page where the model has one");
          return;
        }
        auto [a, fa] = page_of.emplace(t, g);
        auto [b, fb] = token_of.emplace(g, t);
        DH_EXPECT(a->second == g && b->second == t, who() + ": pages shared differently from the model");
      };
      for (const auto& [id, r] : req_) {
        const auto& ms = r.src[s];
        auto who = [&] { return "source " + std::to_string(s) + " request " + std::to_string(id); };
        DH_EXPECT(h_.frontier(id, s) == static_cast<std::int64_t>(ms.tags.size()), who() + ": frontier");
        DH_EXPECT(h_.reserved_rows(id, s) ==
                   static_cast<std::int64_t>(std::min(c_.max_rows, ms.pages.size() * kPageRows)),
               who() + ": reserved rows");
        const auto hp = h_.host_pages_of(id, s);
        for (std::size_t g = 0; g < hp.size(); ++g) {
          if (g < ms.pages.size()) {
            match(ms.pages[g], hp[g], [&] { return who() + " page " + std::to_string(g); });
          } else {
            DH_EXPECT(hp[g] == no_page, who() + ": a host page past the model's");
          }
        }
        const auto om = h_.optional_map_of(id, s);
        for (std::size_t g = 0; g < om.size(); ++g) DH_EXPECT(om[g] == ms.opt[g], who() + ": optional map");
      }
      std::set<token> by_prefix;  // distinct pages the prefixes hold
      for (const auto& [p, mp] : pre_) {
        auto who = [&] { return "source " + std::to_string(s) + " prefix " + std::to_string(p); };
        DH_EXPECT(h_.prefix_rows(p, s) == mp.rows[s], who() + ": rows");
        const auto hp = h_.prefix_host_pages(p, s);
        DH_EXPECT(hp.size() == mp.pages[s].size(), who() + ": page count");
        for (std::size_t g = 0; g < mp.pages[s].size() && g < hp.size(); ++g) {
          by_prefix.insert(mp.pages[s][g]);
          match(mp.pages[s][g], hp[g], [&] { return who() + " page " + std::to_string(g); });
        }
      }
      DH_EXPECT(page_of.size() == used_tokens(s), "the model's tokens in use and the pages seen differ");
      std::map<token, std::uint32_t> prefix_holders;
      for (const auto& [p, mp] : pre_)
        for (token t : mp.pages[s]) ++prefix_holders[t];
      for (const auto& [t, g] : page_of) {
        DH_EXPECT(h_.host_page_refs(s, g) == refs_[s].at(t), "source " + std::to_string(s) + ": holders of host page " +
                                                                std::to_string(g));
        const auto it = prefix_holders.find(t);
        DH_EXPECT(h_.host_page_prefix_refs(s, g) == (it == prefix_holders.end() ? 0u : it->second),
                  "prefix holders of a host page");
      }
      DH_EXPECT(h_.free_host_pages(s) == free_pages(s), "source " + std::to_string(s) + ": free host pages " +
                                                         std::to_string(h_.free_host_pages(s)) + ", model " +
                                                         std::to_string(free_pages(s)));
      DH_EXPECT(h_.prefix_pages_held(s) == by_prefix.size(), "prefix pages held");
      DH_EXPECT(by_prefix.size() <= c_.prefix_pages, "model over budget");
      DH_EXPECT(h_.free_optional_pages(s) == free_opt_[s].size(), "free optional pages");
      for (const auto& [g, n] : opt_refs_[s]) DH_EXPECT(h_.optional_page_refs(s, g) == n, "optional page sharing count");
      for (const auto& [t, g] : opt_of_token_[s]) DH_EXPECT(h_.optional_page_of_host(s, page_of.at(t)) == g, "pool page of a host page");
    }
    DH_EXPECT(h_.retained_prefixes() == lru_, "retained prefixes in LRU order");
  }

#undef DH_EXPECT
  run_config c_;
  H h_;
  test_rng rng_;
  std::map<request_id, model_request> req_;
  std::map<prefix_id, model_prefix> pre_;
  std::vector<prefix_id> lru_;  // least recently used first
  std::vector<prefix_id> released_;
  std::array<std::map<token, std::uint32_t>, kSources> refs_;  // token -> holders (requests and prefixes)
  std::array<std::map<token, std::int32_t>, kSources> opt_of_token_;
  std::array<std::map<std::int32_t, std::uint32_t>, kSources> opt_refs_;
  std::array<std::set<std::int32_t>, kSources> free_opt_;
  token next_token_ = 1;
  request_id next_id_ = 1;
  prefix_id next_prefix_ = 1;
};

}  // namespace

TEST_CASE("shared prefixes against the model: 10^6 operations, every page, count and row checked") {
  const std::array<run_config, 4> configs{{
      {.host_pages = 40, .prefix_pages = 12, .seed = 11},  // tight store and budget: waits, exhaustion, evictions
      {.host_pages = 64, .prefix_pages = 64, .seed = 12},  // the budget is the whole store
      {.max_requests = 3, .host_pages = 30, .prefix_pages = 6, .optional_pages = 4, .seed = 13},
      {.max_requests = 8, .max_rows = 40, .host_pages = 64, .prefix_pages = 20, .optional_pages = 16, .seed = 14},
  }};
  std::size_t total_ops = 0, total_checks = 0;
  for (const auto& c : configs) {
    prefix_model_run run(c);
    run.run(kOpsPerConfig);
    total_ops += run.ops;
    total_checks += run.checks;
    std::cout << "prefix model seed " << c.seed << ": " << run.ops << " operations, " << run.checks << " checks, "
              << run.errors_seen << " typed errors, " << run.waits << " waits, " << run.shared_admits
              << " admissions on a prefix, " << run.evictions << " evictions, " << run.resolved_rows
              << " resolved rows\n";
    CHECK(run.shared_admits > 0);
    CHECK((run.evictions > 0 || c.prefix_pages >= c.host_pages));
  }
  std::cout << "prefix model: " << total_ops << " operations, " << total_checks << " checks\n";
#ifndef DHISPARSE_PREFIX_OPS
#  if !defined(__SANITIZE_ADDRESS__)
  REQUIRE(total_ops >= 1'000'000);
#  endif
#endif
}
